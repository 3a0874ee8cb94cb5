// `lode serve -m MODEL [--host H] [--port P] [--api-key K] ...`: an OpenAI- and Anthropic-compatible HTTP server
// (docs/SERVER.md), on the GPU when there is one, else on the CPU engine, with --parallel slots
// (sequences decoded together in one step). SIGINT and SIGTERM stop it gracefully: no new
// connections, generations in flight cancelled, exit 0.
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "cli/backend.h"
#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/validators.h"
#include "core/error.h"
#include "cpu/engine.h"
#include "model/weights.h"
#include "plan/memory_plan.h"
#include "server/server.h"

namespace lode::cli {
namespace {

struct ServeOptions {
  std::string model;
  std::string kv;  // --kv; empty: LODE_KV, else fp16
  int64_t context = 0;  // positions per sequence; 0: the model's context length
  int threads = 0;      // the CPU engine's threads; 0: all cores
  server::ServerOptions server;
  int64_t max_body_bytes = 8 << 20;
  BackendOptions backend;
  int64_t kv_positions = 0;     // --kv-positions (the GPU's shared pool; 0: --parallel x --ctx)
  int64_t prefix_cache_mib = -1;  // --prefix-cache-mib (-1: a quarter of the machine's RAM)
  std::optional<int64_t> prompt_tokens;  // --prompt-tokens; unset: kGpuChunk on the GPU, 0 on the CPU
  std::optional<int64_t> mtp_sequences;  // --mtp-sequences; unset: kGpuDraftSequences on the GPU, 0 on the CPU
};

// On the GPU: a prefix checkpoint every kGpuChunk prompt tokens, or every whole number of them that
// is at least the context over kGpuCheckpoints (a checkpoint shares the sequence's K/V pages but
// copies its DeltaNet states to host memory, tens of MiB for the 35B, so not many of them),
// kGpuCheckpoints kept; a step takes kGpuChunk tokens of a prompt at most, so that decoding
// sequences wait for no more than that at a time. By default a step also takes kGpuChunk prompt
// tokens in all from several prompts' pieces (--prompt-tokens): on an H100 with the 35B synth,
// 16 / 64 streams of 200-word prompts decoded 960 / 1,282 tokens/s against 832 / 1,037 one piece a
// step, with ITL p99 at 64 streams 146 ms against 149 and at 16 streams 103 against 69 (4,096:
// 1,022 / 1,383, but 359 ms at 64; SERVER.md).
constexpr int64_t kGpuChunk = 1024;
constexpr size_t kGpuCheckpoints = 8;

// "cpu" or "cuda": --backend, with auto the GPU when there is one.
std::string serving_backend(const ServeOptions& o) {
  if (o.backend.backend != "auto") return o.backend.backend;
  return first_gpu().empty() ? "cpu" : "cuda";
}

// The engine on the GPU, --parallel sequences; the worker's chunks and checkpoints sized for it.
std::shared_ptr<engine::Model> gpu_engine(ServeOptions& o, const server::ServedModel& model,
                                          std::shared_ptr<const model::ModelWeights> weights, kv::Format kv) {
  const int sequences = o.server.worker.parallel;
  const GpuRun run{.ctx = gpu_context(model.config, o.context),
                   .activations = model::Activations::q8,
                   .kv_format = kv,
                   .mtp = o.server.worker.mtp,
                   // (no more than can decode at once: the kept states are for their windows)
                   .draft_sequences = o.server.worker.mtp > 0 && o.mtp_sequences
                                          ? gpu_draft_sequences(o.server.worker.mtp, sequences, *o.mtp_sequences)
                                          : gpu_draft_sequences(o.server.worker.mtp, sequences),
                   .sequences = sequences,
                   .kv_positions = o.kv_positions};
  auto engine = open_gpu_model(o.backend, model.reader, model.config, std::move(weights), run);
  o.server.worker.mtp_sequences = run.draft_sequences;  // (the windows its steps hold)
  const int64_t interval = std::max<int64_t>(kGpuChunk, run.ctx / int64_t(kGpuCheckpoints));
  o.server.worker.chunk = (interval + kGpuChunk - 1) / kGpuChunk * kGpuChunk;
  o.server.worker.prompt_step = kGpuChunk;
  o.server.worker.prompt_tokens = o.prompt_tokens.value_or(kGpuChunk);
  o.server.worker.checkpoints_per_slot = kGpuCheckpoints;
  fmt::print(stderr, "lode serve: on the GPU ({}), {} sequence(s) at once (others queue, up to --max-queue)\n",
             first_gpu(), sequences);
  return engine;
}

void serve(ServeOptions& o) {
  // Block the stop signals in every thread (they inherit this mask) and wait for them here, so the
  // shutdown runs as ordinary code rather than inside a signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  o.server.max_body_bytes = size_t(o.max_body_bytes);
  const std::string backend = serving_backend(o);
  auto model = std::make_shared<const server::ServedModel>(o.model);
  const kv::Format kv_format = chosen_kv_format(o.kv);
  auto weights = std::make_shared<const model::ModelWeights>(model::bind_weights(model->reader, model->config));
  std::shared_ptr<engine::Model> engine;
  if (backend == "cuda") {
    try {
      engine = gpu_engine(o, *model, weights, kv_format);
    } catch (const Error& e) {
      if (o.backend.backend == "cuda") throw;
      // A type without GPU kernels, a model larger than the budget, a GPU this build has no code for.
      fmt::print(stderr, "lode serve: the GPU cannot run this model ({}); on the CPU engine instead (--backend cuda "
                 "to insist)\n", e.what());
    }
  }
  if (!engine) {
    note_gpu_options_unused(o.backend);
    o.server.worker.prompt_tokens = o.prompt_tokens.value_or(0);
    o.server.worker.mtp_sequences = o.mtp_sequences.value_or(0);
    if (o.kv_positions > 0)
      fmt::print(stderr, "lode serve: --kv-positions is the GPU's; the CPU engine's K/V grows as each sequence writes\n");
    const cpu::SessionOptions cpu{.threads = o.threads,
                                  .max_context = o.context > 0 ? o.context : model->config.context_length,
                                  .kv_format = kv_format};
    fmt::print(stderr, "lode serve: K/V cache {} per sequence at most, {} sequences\n",
               kv::describe(cpu.kv_format, model->config.n_full_attention_layers(), model->config.n_kv_heads,
                            model->config.head_dim, cpu.max_context),
               o.server.worker.parallel);
    engine = cpu::CpuModel::make(std::move(weights), cpu);
  }
  // (after the engine, which sets the checkpoints per slot)
  o.server.worker.checkpoint_bytes_limit =
      o.prefix_cache_mib >= 0 ? o.prefix_cache_mib << 20 : int64_t(plan::host_ram_bytes() / 4);
  if (o.prefix_cache_mib == 0) o.server.worker.checkpoints_per_slot = 0;
  server::Server http(o.server, model, std::move(engine));
  const int port = http.start();
  const bool ipv6 = o.server.host.find(':') != std::string::npos;  // (a URL puts an IPv6 address in brackets)
  fmt::print(stderr, "lode serve: listening on http://{}{}{}:{} (model {})\n", ipv6 ? "[" : "", o.server.host,
             ipv6 ? "]" : "", port, model->id);
  int signal = 0;
  sigwait(&stop_signals, &signal);
  fmt::print(stderr, "lode serve: {} received, stopping\n", signal == SIGINT ? "SIGINT" : "SIGTERM");
  http.stop();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "OpenAI- and Anthropic-compatible HTTP server");
  cmd->add_option("-m,--model", o->model, "GGUF model (for a split model: its first file)")->required();
  cmd->add_option("--host", o->server.host, "Address to listen on (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", o->server.port, "Port (default 8080; 0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->server.api_key, "Require this key (Authorization: Bearer KEY, or x-api-key: KEY) on every route but /health");
  cmd->add_option("--ctx", o->context, "Context length per request (default: the model's; on the GPU the model's up to 8192)")->check(integer_at_least(0));
  cmd->add_option("--threads", o->threads, "CPU threads (default: all cores)")->check(thread_count());
  cmd->add_option("--parallel", o->server.worker.parallel,
                  "Requests generated together (one step runs them all), each keeping its conversation's prefix "
                  "cached (default 4; at most 64 on the GPU)")
      ->check(integer_at_least(1));
  add_backend_options(*cmd, o->backend);
  add_kv_option(*cmd, o->kv);
  cmd->add_option("--kv-positions", o->kv_positions,
                  "On the GPU: positions of K/V all sequences share, taken page by page as they write (default "
                  "--parallel x --ctx, each its whole context); a request waits until the running ones leave room "
                  "for its prompt and max_tokens, and one larger than this is refused. What it saves goes to experts")
      ->check(integer_at_least(0));
  cmd->add_option("--prefix-cache-mib", o->prefix_cache_mib,
                  "Host memory the slots' prefix checkpoints may hold together (DeltaNet states, tens of MiB each "
                  "for a 35B model, page-locked on the GPU); past it the least recently used go first (default: a quarter of the machine's "
                  "RAM; 0: no checkpoints kept)")
      ->check(integer_at_least(0));
  cmd->add_option("--mtp", o->server.worker.mtp,
                  "Draft up to N tokens per sequence and step with the model's MTP block, verified in the same step; "
                  "the replies do not change (default 0: off); only while at most --mtp-sequences sequences decode")
      ->check(CLI::Range(int64_t(0), int64_t(16)));
  cmd->add_option("--mtp-sequences", o->mtp_sequences,
                  "With --mtp: draft only in steps where at most N sequences decode (beside more, every sequence's "
                  "row is its next token); on the GPU a step keeps DeltaNet states for N x (--mtp + 1) rows "
                  "(default 4 on the GPU, or --parallel or 64 / (--mtp + 1) where fewer; at most 64 / (--mtp + 1); 0 on the CPU: any number)")
      ->check(integer_at_least(0));
  cmd->add_option("--mtp-min-p", o->server.worker.mtp_min_p,
                  "Stop drafting when the MTP block's most likely token is below this probability (default 0)")
      ->check(number_in(0, 1));
  cmd->add_option("--alias", o->server.aliases,
                  "Another name requests may give as `model` (repeatable; for clients that hard-code one; replies "
                  "carry the name asked for)");
  cmd->add_option("--prompt-tokens", o->prompt_tokens,
                  "Prompt tokens a step may take from several sequences' prompts at once (0: one prompt's piece a "
                  "step; default 1024 on the GPU, 0 on the CPU); the decoding sequences wait for them all")
      ->check(integer_at_least(0));
  cmd->add_option("--max-queue", o->server.worker.max_queue, "Requests that may wait for a free slot; more get 429 (default 16)")
      ->check(integer_at_least(0));
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body; larger gets 413 (default 8 MiB)")
      ->check(integer_at_least(1));
  cmd->callback([o] { serve(*o); });
}

}  // namespace lode::cli
