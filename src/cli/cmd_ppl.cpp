// `lode ppl -m MODEL -f FILE [--ctx N] [--max-windows N] [--chunk N] [--backend cpu|cuda]`:
// perplexity of the model over a text file, in independent windows of --ctx tokens
// (engine/perplexity.h has the definition), on the CPU engine or the GPU (default: the GPU when
// there is one, as `lode run`). Progress per window on stderr; the result on stdout:
//   perplexity: 12.3456 over 40960 tokens in 40 windows of 1024 (mean NLL 2.5133 nats/token, 0.9876 bits/byte)
//   speed: 2345.6 tokens/s (40.0 s), prompt 2403.2 tokens/s
// The first speed counts scored tokens, the prompt speed every token run through the model.
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "cli/backend.h"
#include "cli/commands.h"
#include "cli/loaded_model.h"
#include "cli/validators.h"
#include "core/error.h"
#include "engine/perplexity.h"

namespace lode::cli {
namespace {

struct PplOptions {
  ModelRunOptions run;
  BackendOptions backend;
  int64_t max_windows = 0;
};

// Bytes for bits/byte: the whole text when every window ran, else the bytes of the tokens the
// windows that ran cover (--max-windows stopped early).
int64_t covered_bytes(const tokenizer::Tokenizer& tok, std::span<const int32_t> tokens,
                      const std::string& text, const engine::PerplexityResult& r, int64_t ctx) {
  if (r.windows == engine::perplexity_windows(int64_t(tokens.size()), ctx)) return int64_t(text.size());
  const size_t end = std::min(tokens.size(), size_t(r.windows * ctx));
  int64_t bytes = 0;
  for (size_t i = 0; i < end; ++i) bytes += int64_t(tok.token_bytes(tokens[i]).size());
  return bytes;
}

void run_ppl(const PplOptions& o) {
  const std::string text = read_prompt_text(o.run);
  LoadedModel model(o.run);
  const std::vector<int32_t> tokens = model.text().encode(text, false);
  // (Its K/V line, or the GPU's plan, on stderr: a sequence holds one window.)
  const std::unique_ptr<engine::Sequence> sequence = open_sequence(o.backend, model, o.run);
  const engine::PerplexityOptions options{.ctx = o.run.ctx, .chunk = o.run.chunk,
                                          .max_windows = o.max_windows};
  engine::PerplexityResult r = engine::perplexity(
      *sequence, tokens, options, [](int64_t w, int64_t windows, const engine::PerplexityResult& so_far) {
        fmt::print(stderr, "[{}/{}] ppl so far {:.4f}\n", w, windows, so_far.perplexity());
      });
  r.text_bytes = covered_bytes(model.text(), tokens, text, r, o.run.ctx);
  fmt::print("perplexity: {:.4f} over {} tokens in {} windows of {} (mean NLL {:.4f} nats/token, {:.4f} bits/byte)\n",
             r.perplexity(), r.scored, r.windows, o.run.ctx, r.mean_nll(), r.bits_per_byte());
  const double seconds = std::max(r.seconds, 1e-9);
  fmt::print("speed: {:.1f} tokens/s ({:.1f} s), prompt {:.1f} tokens/s\n", double(r.scored) / seconds,
             r.seconds, double(r.evaluated_tokens()) / seconds);
}

}  // namespace

void add_ppl_command(CLI::App& app) {
  auto o = std::make_shared<PplOptions>();
  o->run.ctx = 1024;  // a window, not the model's whole context
  auto* cmd = app.add_subcommand("ppl", "Perplexity over a text file, in windows of --ctx tokens");
  add_model_run_options(*cmd, o->run, PromptInput::none);
  cmd->get_option("--ctx")->description("Tokens per window, each evaluated from an empty state (default 1024)");
  // (Both engines: a call's logits are held at once. The CPU's result does not depend on it; the
  // GPU's prompt products may round a row otherwise in a call of another length.)
  cmd->get_option("--chunk")->description(
      "Positions per forward call on either engine, bounding the logits held at once to chunk x vocabulary "
      "floats (default 64; the GPU runs larger calls faster, and its figure may move in the last digits with it)");
  cmd->add_option("-f,--file", o->run.prompt_file, "The text file to score")->required()->check(CLI::ExistingFile);
  cmd->add_option("--max-windows", o->max_windows, "Evaluate at most this many windows (default 0: all)")
      ->check(integer_at_least(0));
  add_backend_options(*cmd, o->backend);
  cmd->get_option("--backend")->description(
      "auto (default: the GPU when there is one, else the CPU), cpu, or cuda: the whole model on the GPU, its K/V "
      "for one window (--threads is the CPU engine's)");
  cmd->callback([o] { run_ppl(*o); });
}

}  // namespace lode::cli
