#include "server/server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "core/error.h"
#include "server/anthropic_request.h"
#include "server/anthropic_response.h"
#include "server/anthropic_streaming.h"
#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/peer_watch.h"
#include "server/streaming.h"
#include "server/token_routes.h"
#include "server/wire_json.h"

namespace lode::server {
namespace {

using json = nlohmann::ordered_json;

constexpr const char* kJson = "application/json";

// Each route's path and method, for telling 405 (known path, other method) from 404.
struct Route {
  const char* method;
  const char* path;
};
constexpr Route kRoutes[] = {{"GET", "/health"},
                             {"GET", "/v1/models"},
                             {"POST", "/v1/chat/completions"},
                             {"POST", "/v1/completions"},
                             {"POST", "/v1/messages"},
                             {"POST", "/v1/messages/count_tokens"},
                             {"POST", "/tokenize"},
                             {"POST", "/detokenize"},
                             {"GET", "/v1/status"},
                             {"GET", "/metrics"}};

// GET /v1/models/{id}: a model asked by name, the one route whose path has a variable part.
constexpr std::string_view kModelByName = "/v1/models/";
bool model_by_name(const std::string& path) { return path.size() > kModelByName.size() && path.starts_with(kModelByName); }

// The Anthropic routes answer errors in Anthropic's shape; every other route in OpenAI's.
bool anthropic_route(const std::string& path) { return path.starts_with("/v1/messages"); }

void send_error(httplib::Response& res, const ApiError& e, bool anthropic) {
  res.status = e.status();
  res.set_content(wire_json(anthropic ? e.anthropic_body() : e.body()), kJson);
}

void send_error(httplib::Response& res, const ApiError& e, const httplib::Request& req) {
  send_error(res, e, anthropic_route(req.path));
}

// The route label of /metrics: a known path, "/v1/models/:id" for any model asked by name, or
// "other" (labels of unknown paths or names would grow without bound).
std::string route_label(const std::string& path) {
  for (const Route& r : kRoutes)
    if (path == r.path) return path;
  if (model_by_name(path)) return "/v1/models/:id";
  return "other";
}

// Whether a route takes this method and path (a model by name: GET /v1/models/{id}).
bool has_route(const std::string& method, const std::string& path) {
  for (const Route& r : kRoutes)
    if (path == r.path && method == r.method) return true;
  return method == "GET" && model_by_name(path);
}

// A method that carries a body (as httplib reads them) whose headers say nothing of its length.
bool body_of_no_stated_length(const httplib::Request& req) {
  const bool carries = req.method == "POST" || req.method == "PUT" || req.method == "PATCH";
  return carries && !req.has_header("Content-Length") && req.get_header_value("Transfer-Encoding") != "chunked";
}

// A request no route takes: 405 where the path has a route for another method, else 404.
void send_no_route(const httplib::Request& req, httplib::Response& res) {
  for (const Route& r : kRoutes)
    if (req.path == r.path) {
      res.set_header("Allow", r.method);
      return send_error(res, ApiError(405, "invalid_request_error",
                                      fmt::format("{} {} is not allowed: use {}", req.method, req.path, r.method), {},
                                      "method_not_allowed"), req);
    }
  send_error(res, ApiError(404, "invalid_request_error", fmt::format("no route {} {}", req.method, req.path), {},
                           "unknown_route"), req);
}

// A host to listen on must be an address, or a name this machine resolves: say so before binding,
// whose failure cannot tell a bad address from a port in use.
void check_host(const std::string& host) {
  if (host.empty())
    fail("--host is empty: give an address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)");
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0)
    fail("--host {}: not an address this machine can listen on ({}); give an IP address or a name it resolves", host,
         gai_strerror(rc));
  freeaddrinfo(found);
}

// What an error httplib answers itself (before any route runs) says.
std::string http_error_message(int status) {
  switch (status) {
    case 400: return "malformed HTTP request: its request line, headers, Content-Length or chunked framing could not be read";
    case 414: return "the request line is too long";
    case 431: return "the request's headers are too large";
    default: return fmt::format("HTTP error {}", status);
  }
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

uint64_t random_u64() {
  std::random_device device;
  return (uint64_t(device()) << 32) ^ device();
}

ResponseMeta response_meta(const char* prefix, const std::string& model) {
  return {fmt::format("{}{:016x}", prefix, random_u64()), unix_now(), model};
}

// The whole output of a job that runs to its end (a plain, not streamed, response). Every quarter
// second it asks whether the client is still connected: once it has gone, the job is cancelled
// (its reply would be dropped) and collecting goes on to the job's end, a step or so later.
std::pair<std::string, engine::GenerateResult> collect(JobStream& job, const httplib::Request& req) {
  constexpr auto kCheck = std::chrono::milliseconds(250);
  std::string text;
  auto checked = std::chrono::steady_clock::now();
  for (;;) {
    const std::optional<JobStream::Event> event = job.next_for(kCheck);
    if (const auto now = std::chrono::steady_clock::now(); now - checked >= kCheck && !job.cancelled()) {
      checked = now;
      if (!connection_established(req.local_port, req.remote_port)) job.cancel();
    }
    if (!event) continue;
    text += event->text;
    if (!event->done) continue;
    if (event->shutting_down) throw ApiError(503, "server_error", *event->error, {}, "shutting_down");
    if (event->error) throw ApiError(500, "server_error", "generation failed: " + *event->error);
    return {std::move(text), std::move(*event->result)};
  }
}

void merge(chat::ParsedDelta& into, chat::ParsedDelta more) {
  into.reasoning += more.reasoning;
  into.content += more.content;
  for (auto& call : more.tool_calls) into.tool_calls.push_back(std::move(call));
}

bool authorized(const httplib::Request& req, const std::string& key) {
  return req.get_header_value("Authorization") == "Bearer " + key || req.get_header_value("x-api-key") == key;
}

// Streams a job's events through `writer` (one of streaming.h's writers) as SSE. `active` keeps the
// request counted until the stream ends; a client that leaves cancels the job.
template <class Writer>
void stream_events(httplib::Response& res, std::shared_ptr<Writer> writer, std::shared_ptr<JobStream> job,
                   std::shared_ptr<const void> active) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // (a proxy in front, nginx's default, would hold tokens back)
  res.set_chunked_content_provider(
      "text/event-stream", [writer, active](size_t, httplib::DataSink& sink) { return writer->step(sink); },
      [job](bool) { job->cancel(); });  // a no-op when it ended; stops it when the client left
}

// Runs a route's body; whatever it throws becomes an error response, never a crash.
template <class Body>
void guard(const httplib::Request& req, httplib::Response& res, const Body& body) {
  try {
    body();
  } catch (const ApiError& e) {
    send_error(res, e, req);
  } catch (const std::exception& e) {
    send_error(res, ApiError(500, "server_error", fmt::format("internal error: {}", e.what())), req);
  }
}

template <class Handler>
httplib::Server::Handler guarded(Handler handler) {
  return [handler](const httplib::Request& req, httplib::Response& res) { guard(req, res, [&] { handler(req, res); }); };
}

// A request body, read through httplib's content reader so that the limit holds for the bytes as
// they arrive whatever their framing: Content-Length (httplib checks it first), chunked, or
// compressed (the reader hands over the bytes decompressed). A body over the limit is read on,
// dropped, up to twice the limit, so that its client gets the 413 rather than a connection reset
// while it still sends; a larger one is cut off there. A body that trickles in for longer than
// kBodyTime gives its HTTP thread back.
std::string read_body(const httplib::Request& req, const httplib::ContentReader& reader, httplib::Response& res,
                      size_t limit) {
  constexpr auto kBodyTime = std::chrono::seconds(60);
  if (!req.has_header("Content-Length") && !req.has_header("Transfer-Encoding"))
    throw ApiError(411, "invalid_request_error",
                   "the request has no Content-Length: send the body with one (or chunked)", {}, "length_required");
  const auto deadline = std::chrono::steady_clock::now() + kBodyTime;
  const size_t drained = 2 * limit + (64 << 10);
  std::string body;
  size_t received = 0;
  bool over = false, late = false;
  const bool whole = reader([&](const char* data, size_t n) {
    received += n;
    late = std::chrono::steady_clock::now() > deadline;
    if (late) return false;
    if (received > limit && !over) over = true, body = std::string();
    if (over) return received <= drained;
    body.append(data, n);
    return true;
  });
  if (whole && !over) return body;
  res.set_header("Connection", "close");  // what is left of the body stays unread: the connection cannot go on
  if (over || res.status == 413)
    throw ApiError(413, "invalid_request_error",
                   fmt::format("the request body is larger than the limit of {} bytes (--max-body-bytes)", limit), {},
                   "request_too_large");
  if (late)
    throw ApiError(408, "invalid_request_error",
                   fmt::format("the request body took longer than {} s to arrive", kBodyTime.count()), {},
                   "request_timeout");
  throw bad_request("the request body could not be read: its chunked framing or its compression is broken");
}

// A POST route: handler(req, body, res) once the body is read (read_body), guarded.
template <class Handler>
httplib::Server::HandlerWithContentReader guarded_post(Handler handler, size_t limit) {
  return [handler, limit](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    guard(req, res, [&] { handler(req, read_body(req, reader, res, limit), res); });
  };
}

// A request parsed by parse(): a JSON type the field checks did not foresee is the client's mistake
// all the same (400), not the server's.
template <class Parse>
auto parsed(const Parse& parse) {
  try {
    return parse();
  } catch (const nlohmann::json::exception& e) {
    throw bad_request(fmt::format("a field of the request has the wrong type: {}", e.what()));
  }
}

}  // namespace

Server::Server(ServerOptions options, std::shared_ptr<const ServedModel> model, std::shared_ptr<engine::Model> engine)
    : options_(std::move(options)), model_(std::move(model)), names_(model_->id, options_.aliases), created_(unix_now()),
      worker_(std::make_unique<EngineWorker>(*model_, std::move(engine), options_.worker,
                                             [this](const engine::GenerateResult& r) { stats_.record_generation(r); })),
      http_(std::make_unique<httplib::Server>()) {
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_keep_alive_timeout(2);  // idle connections do not hold up stop() for long
  // A connection holds an HTTP thread while its request runs or waits in the worker's queue, so
  // there are enough for every slot and queue place, and some to answer 429s and /health.
  const size_t http_threads = size_t(options_.worker.parallel + options_.worker.max_queue + 8);
  http_->new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
  // httplib's default adds SO_REUSEPORT, which lets a second server take a port already in use;
  // we want that to fail and say so.
  http_->set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_socket_ = sock;
  });
  add_routes();
}

Server::~Server() { stop(); }

void Server::add_routes() {
  httplib::Server& http = *http_;
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() || req.path == "/health" || authorized(req, options_.api_key)) {
      // httplib reads a body no route takes before it answers, and one of no stated length until the
      // connection closes: answer such a request now.
      if (!body_of_no_stated_length(req) || has_route(req.method, req.path))
        return httplib::Server::HandlerResponse::Unhandled;
      send_no_route(req, res);
      return httplib::Server::HandlerResponse::Handled;
    }
    send_error(res, ApiError(401, "authentication_error",
                             "missing or wrong API key: send `Authorization: Bearer KEY` (or `x-api-key: KEY`)",
                             {}, "invalid_api_key"), req);
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib answers itself (no route, body too large) get OpenAI-style bodies too.
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [max_body = options_.max_body_bytes](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // ours already
    if (res.status == 404) {
      send_no_route(req, res);
    } else if (res.status == 413) {
      send_error(res, ApiError(413, "invalid_request_error",
                               fmt::format("the request body is larger than the limit of {} bytes", max_body),
                               {}, "request_too_large"), req);
    } else {
      send_error(res, ApiError(res.status, "invalid_request_error", http_error_message(res.status)), req);
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  // Called once a response has gone out (a stream: once it ended), whatever answered it.
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    stats_.record_response(route_label(req.path), res.status);
  });

  http.Get("/health", guarded([](const httplib::Request&, httplib::Response& res) {
    res.set_content(wire_json(json{{"status", "ok"}}), kJson);
  }));
  const auto model_object = [this](const std::string& id) {
    return json{{"id", id}, {"object", "model"}, {"created", created_}, {"owned_by", "lode"}};
  };
  http.Get("/v1/models", guarded([this, model_object](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    data.push_back(model_object(names_.id));
    for (const std::string& alias : names_.aliases) data.push_back(model_object(alias));
    res.set_content(wire_json(json{{"object", "list"}, {"data", data}}), kJson);
  }));
  http.Get("/v1/models/(.+)", guarded([this, model_object](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id != names_.id && std::find(names_.aliases.begin(), names_.aliases.end(), id) == names_.aliases.end())
      throw ApiError(404, "invalid_request_error", fmt::format("the model \"{}\" does not exist: this server has {}", id, names_.id),
                     "model", "model_not_found");
    res.set_content(wire_json(model_object(id)), kJson);
  }));
  http.Get("/v1/status", guarded([this](const httplib::Request&, httplib::Response& res) {
    res.set_content(wire_json(status_json()), kJson);
  }));
  http.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus_text(stats_.snapshot(), worker_->waiting()), "text/plain; version=0.0.4");
  }));
  add_generation_routes();
  add_anthropic_route();
  add_token_routes();
}

void Server::add_token_routes() {
  const size_t limit = options_.max_body_bytes;
  http_->Post("/tokenize", guarded_post([this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    res.set_content(wire_json(parsed([&] { return tokenize_reply(parse_json_body(body), *model_, names_, worker_->context()); })),
                    kJson);
  }, limit));
  http_->Post("/detokenize", guarded_post([this](const httplib::Request&, const std::string& body, httplib::Response& res) {
    res.set_content(wire_json(parsed([&] { return detokenize_reply(parse_json_body(body), *model_, names_); })), kJson);
  }, limit));
}

// The one path of every generation route: the job goes to the worker; then the whole reply is
// collected and built by whole(meta, text, result), or streamed by the writer that
// streamed(job, meta) makes. `active` keeps the request counted until it ends.
template <class Whole, class Streamed>
void Server::respond(const httplib::Request& req, httplib::Response& res, Job job, const GenerationRequest& request,
                     const char* id_prefix, const Whole& whole, const Streamed& streamed) {
  auto active = stats_.begin_request();
  const std::shared_ptr<JobStream> stream = worker_->submit(std::move(job));
  ResponseMeta meta = response_meta(id_prefix, request.model);
  if (!request.stream) {
    const auto [text, result] = collect(*stream, req);
    res.set_content(wire_json(whole(meta, text, result)), kJson);
    return;
  }
  stream_events(res, streamed(stream, std::move(meta)), stream, std::move(active));
}

void Server::add_generation_routes() {
  httplib::Server& http = *http_;

  const size_t limit = options_.max_body_bytes;
  http.Post("/v1/chat/completions", guarded_post([this](const httplib::Request& req, const std::string& body,
                                                        httplib::Response& res) {
    const ChatRequest request = parsed([&] { return parse_chat_request(parse_json_body(body), names_, random_u64()); });
    const bool logprobs_wanted = request.generation.logprobs >= 0;
    // A JSON reply is content, never tool calls, whatever its strings spell.
    const json parsed_tools = request.json_reply ? json(nullptr) : request.tools;
    respond(
        req, res, chat_job(request, *model_, worker_->context()), request.generation, "chatcmpl-",
        [&](const ResponseMeta& meta, const std::string& text, const engine::GenerateResult& result) {
          chat::OutputParser parser(request.reply_thinks(), parsed_tools);
          chat::ParsedDelta reply = parser.push(text);
          merge(reply, parser.finish());
          return chat_completion(meta, reply, result,
                                 logprobs_wanted ? chat_logprobs(result.logprobs, model_->tokenizer) : json(nullptr));
        },
        [&](std::shared_ptr<JobStream> job, ResponseMeta meta) {
          return std::make_shared<ChatStreamWriter>(job, std::move(meta),
                                                    chat::OutputParser(request.reply_thinks(), parsed_tools),
                                                    request.generation.include_usage, model_->tokenizer,
                                                    logprobs_wanted);
        });
  }, limit));

  http.Post("/v1/completions", guarded_post([this](const httplib::Request& req, const std::string& body,
                                                   httplib::Response& res) {
    const CompletionRequest request =
        parsed([&] { return parse_completion_request(parse_json_body(body), names_, random_u64()); });
    const bool logprobs_wanted = request.generation.logprobs >= 0;
    respond(
        req, res, completion_job(request, *model_, worker_->context()), request.generation, "cmpl-",
        [&](const ResponseMeta& meta, const std::string& text, const engine::GenerateResult& result) {
          int64_t offset = 0;
          return text_completion(meta, text, result,
                                 logprobs_wanted ? completion_logprobs(result.logprobs, model_->tokenizer, offset)
                                                 : json(nullptr));
        },
        [&](std::shared_ptr<JobStream> job, ResponseMeta meta) {
          return std::make_shared<CompletionStreamWriter>(job, std::move(meta), request.generation.include_usage,
                                                          model_->tokenizer, logprobs_wanted);
        });
  }, limit));
}

void Server::add_anthropic_route() {
  const size_t limit = options_.max_body_bytes;
  http_->Post("/v1/messages", guarded_post([this](const httplib::Request& req, const std::string& body,
                                                  httplib::Response& res) {
    const ChatRequest request = parsed([&] { return parse_messages_request(parse_json_body(body), names_, random_u64()); });
    Job job = chat_job(request, *model_, worker_->context());
    const int64_t input_tokens = int64_t(job.prompt.size());
    respond(
        req, res, std::move(job), request.generation, "msg_",
        [&](const ResponseMeta& meta, const std::string& text, const engine::GenerateResult& result) {
          chat::OutputParser parser(request.reply_thinks(), request.tools);
          chat::ParsedDelta reply = parser.push(text);
          merge(reply, parser.finish());
          const auto stop_sequence = matched_stop_sequence(result, model_->tokenizer, request.generation.stop);
          return anthropic_message(meta, reply, result, stop_sequence);
        },
        [&](std::shared_ptr<JobStream> job, ResponseMeta meta) {
          return std::make_shared<MessagesStreamWriter>(job, std::move(meta),
                                                        chat::OutputParser(request.reply_thinks(), request.tools),
                                                        input_tokens, request.generation.stop, model_->tokenizer);
        });
  }, limit));
  // The prompt's length, as the Messages route would render it, without generating.
  http_->Post("/v1/messages/count_tokens", guarded_post([this](const httplib::Request&, const std::string& body,
                                                               httplib::Response& res) {
    const ChatRequest request = parsed([&] { return parse_count_tokens_request(parse_json_body(body), names_); });
    res.set_content(wire_json(json{{"input_tokens", int64_t(chat_prompt(request, *model_).size())}}), kJson);
  }, limit));
}

json Server::status_json() const {
  std::set<std::string> formats;  // the weight formats of the model's tensors
  for (const auto& tensor : model_->reader.tensors()) formats.insert(tensor.type->name);
  const ServerStats::Snapshot s = stats_.snapshot();
  const EngineWorker::StepCounts steps = worker_->step_counts();
  const engine::EngineInfo engine = worker_->engine_info();
  return {{"model", model_->id},
          {"backend", engine.backend},
          {"gpus", engine.gpus},
          {"context", worker_->context()},
          {"threads", engine.threads},
          {"queue", {{"waiting", worker_->waiting()}, {"max", worker_->max_queue()}}},
          {"sequences", {{"active", worker_->active()}, {"parallel", worker_->parallel()}}},
          {"steps",
           {{"total", steps.steps},
            {"max_batch", steps.max_batch},
            {"mixed", steps.mixed_steps},
            {"seconds", steps.step_seconds},
            {"prompt_seconds", steps.prompt_step_seconds},
            {"prompt_tokens", steps.prompt_tokens},
            {"prompt_rows_max", steps.max_prompt_rows}}},
          {"requests", {{"total", s.responses_total}, {"active", s.active}}},
          {"memory",
           {{"rss_bytes", resident_bytes()},
            {"prefix_checkpoint_bytes", worker_->checkpoint_bytes()},
            {"kv_bytes", worker_->kv_bytes()},
            {"kv_pool_positions", engine.kv_pool_positions},
            {"kv_pool_free_positions", worker_->kv_pool_free_positions()}}},
          {"mtp", mtp_json(s, steps)},
          {"kv_format", kv::to_string(engine.kv_format)},
          {"formats", formats}};
}

// Speculative decoding's figures (--mtp; zeros without): drafts, acceptance and tokens per verify
// window over the finished requests, and the verify steps' time (a step verifies the window of every
// sequence that drafted) with the most sequences' drafts one of them verified.
json Server::mtp_json(const ServerStats::Snapshot& s, const EngineWorker::StepCounts& steps) const {
  const auto share = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  return {{"drafts", worker_->mtp()},
          {"windows", s.mtp_windows},
          {"drafted", s.mtp_drafted},
          {"accepted", s.mtp_accepted},
          {"acceptance", share(double(s.mtp_accepted), double(s.mtp_drafted))},
          {"tokens_per_window", share(double(s.mtp_windows + s.mtp_accepted), double(s.mtp_windows))},
          {"verify_steps", steps.verify_steps},
          {"ms_per_verify_step", share(1000.0 * steps.verify_step_seconds, double(steps.verify_steps))},
          {"max_sequences_per_verify_step", steps.max_verified_sequences}};
}

int Server::start() {
  if (listener_.joinable()) fail("the server is already started");
  check_host(options_.host);
  const int port = options_.port == 0 ? http_->bind_to_any_port(options_.host)
                                      : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port <= 0)
    fail("cannot listen on {}:{}: the address is in use or not local (choose another --host/--port)", options_.host,
         options_.port);
  // cpp-httplib 0.11 listens with a backlog of 5: a burst of clients connecting at once overflows
  // it and some connections fail. Listening again on the bound socket raises the backlog.
  if (listen_socket_ >= 0) ::listen(listen_socket_, SOMAXCONN);
  listener_ = std::thread([this] { http_->listen_after_bind(); });
  return port;
}

void Server::stop() {
  // Generations first, so streams in flight end and their connections let go; then the sockets.
  worker_->stop();
  http_->stop();
  if (listener_.joinable()) listener_.join();
}

}  // namespace lode::server
