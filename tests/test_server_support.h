// Shared by the server tests: lode-mini loaded once, in-process servers on free ports, and small
// helpers to post JSON and read Server-Sent Events.
#pragma once
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "server/server.h"

namespace lode::test {

using json = nlohmann::ordered_json;

inline std::shared_ptr<const server::ServedModel> mini_model() {
  static const auto model =
      std::make_shared<const server::ServedModel>(LODE_TEST_DATA "/../../models/lode-mini.gguf");
  return model;
}

// A server on a free loopback port, stopped when it goes out of scope.
struct TestServer {
  explicit TestServer(server::ServerOptions options = {}) {
    options.port = 0;
    options.worker.threads = 1;
    if (options.worker.context == 0) options.worker.context = 512;
    server = std::make_unique<server::Server>(options, mini_model());
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

// The "data: " payloads of an SSE body, in order ("[DONE]" included as a string).
inline std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "an event does not end with a blank line: " << body.substr(pos);
    if (end == std::string::npos) break;
    const std::string event = body.substr(pos, end - pos);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

// Anthropic-style SSE: each event an `event: TYPE` line and a `data: JSON` line. Checks that the
// event line names the data's own type.
inline std::vector<json> sse_typed_events(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "an event does not end with a blank line: " << body.substr(pos);
    if (end == std::string::npos) break;
    const std::string event = body.substr(pos, end - pos);
    pos = end + 2;
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
