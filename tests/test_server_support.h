// Shared by the server tests: lode-mini loaded once, in-process servers on free ports, and small
// helpers to post JSON and read Server-Sent Events.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpu/engine.h"
#ifdef LODE_HAVE_CUDA
#include "cuda/engine.h"
#endif
#include "model/weights.h"
#include "server/server.h"
#include "support/paths.h"

namespace lode::test {

using json = nlohmann::ordered_json;

inline std::shared_ptr<const server::ServedModel> mini_model() {
  static const auto model =
      std::make_shared<const server::ServedModel>(lode::test::mini_model_path().string());
  return model;
}

// lode-mini's tokens as the JSON mask reads them (sample/json_tokens.h): each one's bytes, and
// whether it is markup (control and added tokens, never JSON text).
struct TokenBytes {
  std::vector<std::string_view> bytes;
  std::vector<bool> markup;
};
inline TokenBytes mini_token_bytes() {
  const tokenizer::Tokenizer& tok = mini_model()->tokenizer;
  TokenBytes out;
  for (int32_t id = 0; id < int32_t(tok.size()); ++id) {
    out.bytes.push_back(tok.token_bytes(id));
    const auto type = tok.type(id);
    out.markup.push_back(type == tokenizer::TokenType::control || type == tokenizer::TokenType::user_defined);
  }
  return out;
}

// The CPU engine on lode-mini's weights (bound once): one thread, 512 positions unless asked.
inline std::shared_ptr<engine::Model> mini_engine(cpu::SessionOptions options = {}) {
  static const auto weights = std::make_shared<const model::ModelWeights>(
      model::bind_weights(mini_model()->reader, mini_model()->config));
  options.threads = 1;
  if (options.max_context == 0) options.max_context = 512;
  return cpu::CpuModel::make(weights, options);
}

#ifdef LODE_HAVE_CUDA
// lode-mini on the GPU, holding `sequences` sequences of 512 positions, K/V in fp16; with `mtp`, the
// MTP block and steps that hold the verify windows of up to mtp + 1 tokens of `draft_sequences`
// sequences (lode serve's --mtp-sequences).
inline std::shared_ptr<engine::Model> gpu_mini_engine(int64_t sequences, int64_t mtp = 0, int64_t draft_sequences = 1) {
  static const auto weights = std::make_shared<const model::ModelWeights>(
      model::bind_weights(mini_model()->reader, mini_model()->config));
  const int64_t window_rows = mtp > 0 ? draft_sequences * (mtp + 1) : 0;
  cuda::CudaSessionOptions o{.max_context = 512,
                             .step_rows = std::max(sequences, window_rows),
                             .window_rows = window_rows,
                             .sequences = sequences,
                             .mtp = mtp > 0};
  o.kv_format = kv::Format::f16;
  return std::make_shared<cuda::CudaModel>(std::make_unique<cuda::CudaSession>(mini_model()->reader, weights, o));
}
#endif

// A chat completion's reasoning and content, "reasoning|content".
inline std::string reply_text(const json& reply) {
  const json& m = reply["choices"][0]["message"];
  return m.value("reasoning_content", "") + "|" + (m["content"].is_string() ? m["content"].get<std::string>() : "");
}

// A server on a free loopback port, stopped when it goes out of scope.
struct TestServer {
  explicit TestServer(server::ServerOptions options = {}, cpu::SessionOptions engine = {})
      : TestServer(options, mini_engine(engine)) {}
  // On another engine of lode-mini (the GPU's).
  TestServer(server::ServerOptions options, std::shared_ptr<engine::Model> engine) {
    options.port = 0;
    server = std::make_unique<server::Server>(options, mini_model(), std::move(engine));
    port = server->start();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body, const httplib::Headers& headers = {}) const {
    return client().Post(path.c_str(), headers, body, "application/json");
  }
  json post_json(const std::string& path, const json& body, int expected_status = 200) const {
    auto res = post(path, body.dump());
    EXPECT_TRUE(res) << "no response from " << path;
    if (!res) return {};
    EXPECT_EQ(res->status, expected_status) << res->body;
    return json::parse(res->body);
  }
  // Any method, path and body (a JSON content type when there is a body): for malformed requests.
  httplib::Result send(const std::string& method, const std::string& path, const std::string& body) const {
    httplib::Request req;
    req.method = method;
    req.path = path;
    req.body = body;
    if (!body.empty()) req.set_header("Content-Type", "application/json");
    return client().send(req);
  }
  json get_json(const std::string& path) const {
    auto res = client().Get(path.c_str());
    EXPECT_TRUE(res) << "no response from " << path;
    if (!res) return {};
    EXPECT_EQ(res->status, 200) << res->body;
    return json::parse(res->body);
  }
  std::unique_ptr<server::Server> server;
  int port = 0;
};

// A POST request carrying JSON, for tests that read the response their own way.
inline httplib::Request json_request(const std::string& path, const json& body) {
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  return req;
}

// Reads a stream until `events` events arrived (setting *started at the first), then hangs up.
inline void stream_then_leave(const TestServer& s, const std::string& path, const json& body, int events,
                              std::atomic<bool>* started = nullptr) {
  httplib::Request req = json_request(path, body);
  int seen = 0;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    for (size_t i = 0; i + 1 < n; ++i) seen += data[i] == '\n' && data[i + 1] == '\n';
    if (seen >= 1 && started) *started = true;
    return seen < events;
  };
  s.client().send(req);
}

// Polls `pred` every 10 ms until it holds; false when it still does not after `limit`. The tests
// wait on the server's state this way, never on a sleep of a guessed length. The limit only keeps a
// broken server from hanging the test; it is not a claim about speed.
template <class Pred>
bool eventually(Pred pred, std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// The value of one unlabelled sample of GET /metrics (-1 when absent).
inline double metric_value(const TestServer& s, const std::string& name) {
  auto res = s.client().Get("/metrics");
  if (!res) return -1;
  const std::string& text = res->body;
  for (size_t at = text.find(name + " "); at != std::string::npos; at = text.find(name + " ", at + 1))
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + name.size() + 1));
  return -1;
}

// The events of an SSE body (each ended by a blank line), in order.
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "an event does not end with a blank line: " << body.substr(pos);
    if (end == std::string::npos) break;
    out.push_back(body.substr(pos, end - pos));
    pos = end + 2;
  }
  return out;
}

// The "data: " payloads of an SSE body, in order ("[DONE]" included as a string).
inline std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  for (const std::string& event : sse_events(body)) {
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    out.push_back(event.substr(6));
  }
  return out;
}

// Anthropic-style SSE: each event an `event: TYPE` line and a `data: JSON` line. Checks that the
// event line names the data's own type.
inline std::vector<json> sse_typed_events(const std::string& body) {
  std::vector<json> out;
  for (const std::string& event : sse_events(body)) {
    const size_t newline = event.find('\n');
    EXPECT_EQ(event.rfind("event: ", 0), 0u) << event;
    EXPECT_NE(newline, std::string::npos) << event;
    if (newline == std::string::npos) continue;
    EXPECT_EQ(event.compare(newline + 1, 6, "data: "), 0) << event;
    json data = json::parse(event.substr(newline + 7));
    EXPECT_EQ(event.substr(7, newline - 7), data.value("type", "")) << event;
    out.push_back(std::move(data));
  }
  return out;
}

}  // namespace lode::test
