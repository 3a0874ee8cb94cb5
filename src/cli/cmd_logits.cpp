// `lode logits -m MODEL --tokens 1,2,3 -o OUT.f32 [--backend cpu|cuda]`: float32 logits of every
// position, row-major [n_tokens, n_vocab], little-endian, from the CPU engine or the GPU (default:
// the GPU when there is one, as `lode run`), so that either engine's logits can be set beside an
// oracle's.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/backend.h"
#include "cli/commands.h"
#include "cli/loaded_model.h"
#include "cli/model_options.h"
#include "cli/output_file.h"
#include "core/error.h"

namespace lode::cli {
namespace {

struct LogitsOptions {
  ModelRunOptions run;
  BackendOptions backend;
  std::string output;
};

void run_logits(LogitsOptions o) {
  const std::vector<int32_t> tokens = parse_token_list(o.run.tokens);
  const std::vector<std::filesystem::path> inputs = gguf::model_files(o.run.model);
  if (o.output != "-") checked_output_path(o.output, inputs);  // (before the work, as again when writing)
  if (o.run.ctx == 0) o.run.ctx = int64_t(tokens.size());     // K/V for the tokens, not the model's context
  LoadedModel model(o.run);
  const std::unique_ptr<engine::Sequence> sequence = open_sequence(o.backend, model, o.run);
  const int64_t vocab = model.vocab();
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float> logits = engine::prefill(*sequence, tokens, o.run.chunk, /*all_logits=*/true);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i]))
      fail("the logit of token {} at position {} is {}: the model produced an invalid value (check the weights and "
           "the backend)", i % size_t(vocab), i / size_t(vocab), logits[i]);
  write_output_file(
      o.output,
      [&](std::FILE* out) {
        if (std::fwrite(logits.data(), sizeof(float), logits.size(), out) != logits.size())
          fail("{}: write failed (disk full?)", o.output);
      },
      inputs);
  const engine::EngineInfo info = sequence->model().info();
  fmt::print(stderr, "wrote {} ({} positions x {} logits; {:.3f} s, {:.1f} tokens/s; {}, K/V {})\n", o.output,
             tokens.size(), vocab, seconds, double(tokens.size()) / seconds, info.backend,
             kv::to_string(info.kv_format));
}

}  // namespace

void add_logits_command(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  auto* cmd = app.add_subcommand("logits", "Write the float32 logits of every prompt position");
  add_model_run_options(*cmd, o->run, PromptInput::token_ids);
  cmd->get_option("--ctx")->description("K/V positions to hold (default: the number of tokens)");
  cmd->add_option("-o,--output", o->output, "Output file: [n_tokens, n_vocab] float32")->required();
  add_backend_options(*cmd, o->backend);
  cmd->get_option("--backend")->description(
      "auto (default: the GPU when there is one, else the CPU), cpu, or cuda: the whole prompt through the GPU's "
      "prompt pass (--threads is the CPU engine's)");
  cmd->callback([o] { run_logits(*o); });
}

}  // namespace lode::cli
