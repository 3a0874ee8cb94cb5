// `lode profile -m MODEL -f TEXT -o PROFILE.json [--ctx N]`: runs the text through the model on the
// GPU in windows of --ctx tokens and records how often each (layer, expert) was chosen
// (plan/routing_profile.h), for --expert-profile to place the hot experts in VRAM first. Says how
// concentrated the routing was: the share of routings that the most-chosen quarter of each
// layer's experts took.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/validators.h"
#include "core/error.h"
#include "core/output_path.h"
#include "gguf/reader.h"
#include "model/qwen35moe.h"
#include "model/weights.h"
#include "plan/routing_profile.h"
#include "tokenizer/tokenizer.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/session.h"
#endif

namespace lode::cli {
namespace {

struct ProfileOptions {
  std::string model, text_file, output;
  int64_t ctx = 4096;
  int64_t vram_budget_mib = 0;
};

// The share of routings the most-chosen quarter of each layer's experts took, averaged over layers.
double top_quarter_share(const plan::RoutingProfile& p) {
  double sum = 0;
  for (int64_t l = 0; l < p.layers; ++l) {
    std::vector<uint64_t> row(p.counts.begin() + l * p.experts, p.counts.begin() + (l + 1) * p.experts);
    std::sort(row.begin(), row.end(), std::greater<>());
    const uint64_t all = std::accumulate(row.begin(), row.end(), uint64_t(0));
    const uint64_t top = std::accumulate(row.begin(), row.begin() + std::max<int64_t>(p.experts / 4, 1), uint64_t(0));
    sum += all ? double(top) / double(all) : 0.0;
  }
  return p.layers ? sum / double(p.layers) : 0.0;
}

#ifdef LODE_HAVE_CUDA
void run_profile(const ProfileOptions& o) {
  std::vector<std::filesystem::path> inputs = gguf::model_files(o.model);
  inputs.push_back(o.text_file);
  const std::filesystem::path output = checked_output_path(o.output, inputs);  // before the run
  const gguf::Reader reader(o.model);
  const auto config = model::read_config(reader.metadata());
  auto weights = std::make_shared<const model::ModelWeights>(model::bind_weights(reader, config));
  ModelRunOptions text_options;
  text_options.prompt_file = o.text_file;
  const std::string text = read_prompt_text(text_options);
  const std::vector<int32_t> tokens = tokenizer::Tokenizer::from_metadata(reader.metadata()).encode(text, false);
  if (tokens.size() < 2) fail("{}: fewer than two tokens of text to profile", o.text_file);
  cuda::CudaSessionOptions options;
  options.max_context = o.ctx;
  options.vram_budget = size_t(o.vram_budget_mib) << 20;
  cuda::CudaSession session(reader, weights, options);
  const bool tty = isatty(fileno(stderr));
  for (size_t at = 0; at < tokens.size(); at += size_t(o.ctx)) {
    const size_t n = std::min(tokens.size() - at, size_t(o.ctx));
    session.reset();
    session.prefill(std::span(tokens.data() + at, n));
    if (tty) fmt::print(stderr, "\r[{}/{} tokens]", at + n, tokens.size());
  }
  if (tty) fmt::print(stderr, "\n");
  plan::RoutingProfile p;
  p.model_name = reader.metadata().get_string_or("general.name", o.model);
  p.fingerprint = plan::routing_fingerprint(*weights);
  p.layers = config.n_layers, p.experts = config.n_experts, p.tokens = tokens.size();
  p.counts = session.routing_counts();
  plan::write_profile(output, p);
  fmt::print("wrote {}: {} tokens, {} layers of {} experts; the most-chosen quarter of each layer's experts took "
             "{:.1f}% of its routings (25% would be uniform)\n",
             o.output, p.tokens, p.layers, p.experts, 100.0 * top_quarter_share(p));
}
#else
void run_profile(const ProfileOptions&) {
  fail("lode profile records routing on the GPU, and this lode was built without CUDA (configure with "
       "LODE_CMAKE_ARGS=-DLODE_CUDA=ON on a machine with nvcc)");
}
#endif

}  // namespace

void add_profile_command(CLI::App& app) {
  auto o = std::make_shared<ProfileOptions>();
  auto* cmd = app.add_subcommand("profile", "Record which experts real text routes to, for --expert-profile");
  cmd->add_option("-m,--model", o->model, "GGUF model (for a split model: its first file)")->required();
  cmd->add_option("-f,--file", o->text_file, "Text to run through the model")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", o->output, "The routing profile to write (JSON)")->required();
  cmd->add_option("--ctx", o->ctx, "Tokens per window (the sequence restarts after each; default 4096)")
      ->check(integer_at_least(1));
  cmd->add_option("--vram-budget", o->vram_budget_mib, "MiB of GPU memory lode may use (default: what is free, less a margin)")
      ->check(integer_at_least(0));
  cmd->callback([o] { run_profile(*o); });
}

}  // namespace lode::cli
