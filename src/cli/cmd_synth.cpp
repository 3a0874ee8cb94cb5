// `lode synth -o OUT.gguf --preset qwen3.6-35b-a3b|tiny [--recipe R] [--layers N] [--mtp]
// [--route-skew S] [--seed N] [--tokenizer tokenizer.json]`: a random but valid qwen35moe model (docs/SYNTH.md).
#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "cli/human.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/output_path.h"
#include "model/synth.h"

namespace lode::cli {
namespace {

struct SynthCliOptions {
  std::string output;
  model::SynthOptions synth;
  double split_max_gib = 0;
};

void run_synth(SynthCliOptions& o) {
  o.synth.max_file_bytes = uint64_t(o.split_max_gib * double(1ull << 30));
  const bool tty = isatty(fileno(stderr));
  o.synth.on_tensor = [tty](size_t i, size_t n, const std::string& name) {
    if (tty)
      fmt::print(stderr, "\r[{}/{}] {:<60.60}", i + 1, n, name);
    else if (i + 1 == n || i % 50 == 0)
      fmt::print(stderr, "[{}/{}] {}\n", i + 1, n, name);
  };
  const auto start = std::chrono::steady_clock::now();
  const auto files = model::write_synth(checked_output_path(o.output), o.synth);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t bytes = 0;
  for (const auto& f : files) bytes += std::filesystem::file_size(f);
  fmt::print(stderr, "{}wrote {} ({} file{}, {}) in {:.1f} s ({:.0f} MB/s)\n", tty ? "\n" : "",
             files.front().string(), files.size(), files.size() == 1 ? "" : "s",
             human_bytes(bytes), seconds, double(bytes) / 1e6 / std::max(seconds, 1e-9));
}

}  // namespace

void add_synth_command(CLI::App& app) {
  auto o = std::make_shared<SynthCliOptions>();
  auto* cmd = app.add_subcommand("synth", "Write a random but valid qwen35moe model (exact geometry)");
  cmd->add_option("-o,--output", o->output, "GGUF file to write")->required();
  cmd->add_option("--preset", o->synth.preset, "qwen3.6-35b-a3b or tiny")->required();
  cmd->add_option("--recipe", o->synth.recipe,
                  "Per-tensor types: ud-q4_k_xl (default), q4_k_m, q8_0, f16, f32");
  cmd->add_option("--layers", o->synth.layers, "Main-model layers (default: the preset's)")
      ->check(CLI::Range(int64_t(1), int64_t(1000)));
  cmd->add_flag("--mtp", o->synth.mtp, "Add the MTP block");
  cmd->add_option("--route-skew", o->synth.route_skew,
                  "Zipf exponent of expert popularity (0: uniform routing)")
      ->check(number_in(0, 16));
  cmd->add_option("--seed", o->synth.seed, "Random seed")->check(unsigned_64());
  cmd->add_flag("--zeros", o->synth.zeros,
                "Every weight zero: the geometry alone, sparse on disk (for lode plan; it computes nothing useful)");
  cmd->add_option("--tokenizer", o->synth.tokenizer_json,
                  "Embed this tokenizer.json (byte-level BPE) so the model speaks real text")
      ->check(CLI::ExistingFile);
  cmd->add_option("--split-max-gib", o->split_max_gib, "Split the output into files of at most this many GiB")
      ->check(number_in(0, 1048576));
  cmd->callback([o] { run_synth(*o); });
}

}  // namespace lode::cli
