// `lode serve -m MODEL [--host H] [--port P] [--api-key K] ...`: an OpenAI- and Anthropic-compatible HTTP server
// on the CPU engine (docs/SERVER.md). SIGINT and SIGTERM stop it gracefully: no new connections,
// generations in flight cancelled, exit 0.
#include <fmt/format.h>
#include <signal.h>

#include <memory>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "cpu/engine.h"
#include "model/weights.h"
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
};

void serve(ServeOptions& o) {
  // Block the stop signals in every thread (they inherit this mask) and wait for them here, so the
  // shutdown runs as ordinary code rather than inside a signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  o.server.max_body_bytes = size_t(o.max_body_bytes);
  auto model = std::make_shared<const server::ServedModel>(o.model);
  const cpu::SessionOptions engine{.threads = o.threads,
                                   .max_context = o.context > 0 ? o.context : model->config.context_length,
                                   .kv_format = chosen_kv_format(o.kv)};
  fmt::print(stderr, "lode serve: K/V cache {} per sequence at most, {} sequences\n",
             kv::describe(engine.kv_format, model->config.n_full_attention_layers(), model->config.n_kv_heads,
                          model->config.head_dim, engine.max_context),
             o.server.worker.parallel);
  auto weights = std::make_shared<const model::ModelWeights>(model::bind_weights(model->reader, model->config));
  server::Server http(o.server, model, cpu::CpuModel::make(std::move(weights), engine));
  const int port = http.start();
  fmt::print(stderr, "lode serve: listening on http://{}:{} (model {})\n", o.server.host, port, model->id);
  int signal = 0;
  sigwait(&stop_signals, &signal);
  fmt::print(stderr, "lode serve: {} received, stopping\n", signal == SIGINT ? "SIGINT" : "SIGTERM");
  http.stop();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "OpenAI- and Anthropic-compatible HTTP server (CPU engine)");
  cmd->add_option("-m,--model", o->model, "GGUF model (for a split model: its first file)")->required();
  cmd->add_option("--host", o->server.host, "Address to listen on (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", o->server.port, "Port (default 8080; 0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->server.api_key, "Require this key (Authorization: Bearer KEY, or x-api-key: KEY) on every route but /health");
  cmd->add_option("--ctx", o->context, "Context length per request (default: the model's)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", o->threads, "CPU threads (default: all cores)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--parallel", o->server.worker.parallel, "Requests generated together, each keeping its conversation's prefix cached (default 4)")
      ->check(CLI::PositiveNumber);
  add_kv_option(*cmd, o->kv);
  cmd->add_option("--mtp", o->server.worker.mtp,
                  "Draft up to N tokens per sequence and step with the model's MTP block, verified in the same step; "
                  "the replies do not change (default 0: off)")
      ->check(CLI::Range(int64_t(0), int64_t(16)));
  cmd->add_option("--mtp-min-p", o->server.worker.mtp_min_p,
                  "Stop drafting when the MTP block's most likely token is below this probability (default 0)")
      ->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--alias", o->server.aliases,
                  "Another name requests may give as `model` (repeatable; for clients that hard-code one; replies "
                  "carry the name asked for)");
  cmd->add_option("--max-queue", o->server.worker.max_queue, "Requests that may wait for a free slot; more get 429 (default 16)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body; larger gets 413 (default 8 MiB)")
      ->check(CLI::PositiveNumber);
  cmd->callback([o] { serve(*o); });
}

}  // namespace lode::cli
