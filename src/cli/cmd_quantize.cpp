// `lode quantize IN.gguf OUT.gguf --type T | --recipe R`: every matrix whose rows fit T's blocks
// becomes T; or, with a recipe, each qwen35moe tensor takes the recipe's type for its role.
#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "cli/human.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/output_path.h"
#include "model/quantize.h"

namespace lode::cli {
namespace {

struct QuantizeCliOptions {
  std::string input, output, type, recipe;
  double split_max_gib = 0;
};

// Split, the output is OUTPUT-0000i-of-0000N.gguf (N known once the split is planned): refused
// where those names are the input's own parts.
void check_split_parts(const std::filesystem::path& output, const std::vector<std::filesystem::path>& inputs) {
  const std::string prefix = gguf::split_prefix(std::filesystem::weakly_canonical(output));
  for (const std::filesystem::path& input : inputs) {
    const auto part = gguf::parse_split_path(std::filesystem::weakly_canonical(input));
    if (part && part->prefix == prefix)
      fail("{}: split, its parts would be named {}-0000i-of-0000N.gguf, which would replace the model it reads "
           "({}); give another output path", output.string(), prefix, input.string());
  }
}

void run_quantize(const QuantizeCliOptions& o) {
  model::QuantizeOptions options;
  if (!o.recipe.empty()) {
    options.recipe = &model::find_recipe(o.recipe);
  } else {
    const auto type = type_from_name(o.type);
    if (!type || !traits(*type).quantize)
      fail("--type {}: not a type lode can write (try q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K, iq4_nl, iq4_xs, "
           "f16, bf16, f32)", o.type);
    options.type = *type;
  }
  const std::vector<std::filesystem::path> inputs = gguf::model_files(o.input);
  const std::filesystem::path output = checked_output_path(o.output, inputs);
  if (o.split_max_gib > 0) check_split_parts(output, inputs);
  gguf::Reader in(o.input);
  options.max_file_bytes = uint64_t(o.split_max_gib * double(1ull << 30));
  const auto start = std::chrono::steady_clock::now();
  // On a terminal one line redrawn in place; in a log one line per tensor.
  const bool tty = isatty(fileno(stderr));
  options.on_tensor = [tty](size_t i, size_t n, const std::string& name) {
    if (tty)
      fmt::print(stderr, "\r[{}/{}] {:<60.60}", i + 1, n, name);
    else
      fmt::print(stderr, "[{}/{}] {}\n", i + 1, n, name);
  };
  const auto files = model::quantize_model(in, output, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t bytes = 0;
  for (const auto& f : files) bytes += std::filesystem::file_size(f);
  fmt::print(stderr, "{}wrote {} ({} file{}, {}) in {:.1f} s\n", tty ? "\n" : "", files.front().string(),
             files.size(),
             files.size() == 1 ? "" : "s", human_bytes(bytes), seconds);
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto o = std::make_shared<QuantizeCliOptions>();
  auto* cmd = app.add_subcommand("quantize", "Re-quantize a GGUF model's matrices to one type");
  cmd->add_option("input", o->input, "GGUF model to read")->required();
  cmd->add_option("output", o->output, "GGUF file to write")->required();
  auto* type = cmd->add_option("--type", o->type, "Target type, e.g. q8_0, q4_K, iq4_xs");
  auto* recipe = cmd->add_option("--recipe", o->recipe,
                                 "Per-tensor types for qwen35moe: ud-q4_k_xl, q4_k_m, q8_0, f16, f32");
  type->excludes(recipe);
  cmd->callback([o, type, recipe] {
    if (type->count() == 0 && recipe->count() == 0) fail("quantize: give --type T or --recipe R");
    run_quantize(*o);
  });
  cmd->add_option("--split-max-gib", o->split_max_gib, "Split the output into files of at most this many GiB")
      ->check(number_in(0, 1048576));
}

}  // namespace lode::cli
