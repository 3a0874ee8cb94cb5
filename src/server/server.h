// `lode serve` as a library: an OpenAI-compatible HTTP server (cpp-httplib) in front of one engine
// worker. Tests run it in-process on a free port:
//
//   auto model = std::make_shared<server::ServedModel>("models/lode-mini.gguf");
//   std::shared_ptr<engine::Model> engine = ...;   // the model's weights on an engine (cli/backend.h)
//   server::Server server({.port = 0}, model, engine);
//   int port = server.start();   // listening once this returns
//   ...                          // requests to http://127.0.0.1:port
//   server.stop();               // cancels generations, closes the socket, joins the threads
//
// Routes: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions,
// POST /v1/messages (Anthropic), GET /v1/status, GET /metrics (see docs/SERVER.md). Every error is
// an OpenAI-style JSON body with the matching status (Anthropic-style on /v1/messages).
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/engine_worker.h"
#include "server/openai_request.h"
#include "server/served_model.h"
#include "server/server_stats.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace lode::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                        // 0: any free port (start() returns it)
  std::string api_key;                    // empty: no key; else every route but /health needs it
  std::size_t max_body_bytes = 8u << 20;  // larger request bodies: 413
  std::vector<std::string> aliases;       // more names `model` may give (listed by /v1/models too)
  WorkerOptions worker;
};

class Server {
 public:
  // `engine` runs `model`'s weights; the server opens options.worker.parallel sequences of it.
  Server(ServerOptions options, std::shared_ptr<const ServedModel> model, std::shared_ptr<engine::Model> engine);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts serving on a thread of its own; returns the port. Fails (lode::Error) when the
  // address cannot be bound.
  int start();
  // Stops accepting, cancels the running and queued generations, and joins every thread.
  // Idempotent; safe to call without start().
  void stop();

  const std::string& model_id() const { return model_->id; }
  const ServerStats& stats() const { return stats_; }

 private:
  void add_routes();
  void add_generation_routes();
  void add_anthropic_route();
  void add_token_routes();  // /tokenize, /detokenize
  template <class Whole, class Streamed>
  void respond(const httplib::Request& req, httplib::Response& res, Job job, const GenerationRequest& request,
               const char* id_prefix, const Whole& whole, const Streamed& streamed);
  nlohmann::ordered_json status_json() const;
  nlohmann::ordered_json mtp_json(const ServerStats::Snapshot& s, const EngineWorker::StepCounts& steps) const;

  ServerOptions options_;
  std::shared_ptr<const ServedModel> model_;
  ModelNames names_;
  int64_t created_;  // Unix seconds when the server was made (the model's "created")
  ServerStats stats_;  // before worker_: the worker records into it
  std::unique_ptr<EngineWorker> worker_;
  std::unique_ptr<httplib::Server> http_;
  int listen_socket_ = -1;  // the listening socket, seen when httplib creates it
  std::thread listener_;
};

}  // namespace lode::server
