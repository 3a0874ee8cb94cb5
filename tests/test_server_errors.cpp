// Malformed and refused requests against an in-process `lode serve`: each gets its status and an
// OpenAI-style error body {"error": {message, type, param, code}}, and the server keeps serving.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/anthropic_response.h"
#include "server/openai_response.h"
#include "test_server_support.h"

namespace lode::test {
namespace {

struct BadRequest {
  const char* name;
  const char* method;
  const char* path;
  std::string body;
  int status;
  const char* type;
  const char* param;    // expected error.param, or nullptr for null / not checked
  const char* message;  // a piece the message must contain
};

std::string chat_with(const json& extra) {
  json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}};
  for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  return body.dump();
}

std::vector<BadRequest> bad_requests() {
  const std::string user = R"({"role": "user", "content": "hi"})";
  return {
      {"malformed JSON", "POST", "/v1/chat/completions", R"({"messages": [)", 400, "invalid_request_error", nullptr, "not valid JSON"},
      {"body not an object", "POST", "/v1/chat/completions", "[1, 2]", 400, "invalid_request_error", nullptr, "JSON object"},
      {"empty body", "POST", "/v1/completions", "", 400, "invalid_request_error", nullptr, "not valid JSON"},
      {"messages missing", "POST", "/v1/chat/completions", R"({"max_tokens": 4})", 400, "invalid_request_error", "messages", "required"},
      {"messages empty", "POST", "/v1/chat/completions", R"({"messages": []})", 400, "invalid_request_error", "messages", "empty"},
      {"messages not a list", "POST", "/v1/chat/completions", R"({"messages": "hi"})", 400, "invalid_request_error", "messages", "list"},
      {"message not an object", "POST", "/v1/chat/completions", R"({"messages": [3]})", 400, "invalid_request_error", "messages[0]", "object"},
      {"unknown role", "POST", "/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "hi"}]})", 400, "invalid_request_error", "messages[0].role", "wizard"},
      {"content wrong type", "POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": 42}]})", 400, "invalid_request_error", "messages[0]", "content"},
      {"no user query", "POST", "/v1/chat/completions", R"({"messages": [{"role": "system", "content": "be brief"}]})", 400, "invalid_request_error", "messages", "No user query found"},
      {"system not first", "POST", "/v1/chat/completions", "{\"messages\": [" + user + R"(, {"role": "system", "content": "x"}]})", 400, "invalid_request_error", "messages", "System message must be at the beginning"},
      {"max_tokens string", "POST", "/v1/chat/completions", chat_with({{"max_tokens", "4"}}), 400, "invalid_request_error", "max_tokens", "integer"},
      {"max_tokens zero", "POST", "/v1/chat/completions", chat_with({{"max_tokens", 0}}), 400, "invalid_request_error", "max_tokens", "outside"},
      {"temperature string", "POST", "/v1/chat/completions", chat_with({{"temperature", "hot"}}), 400, "invalid_request_error", "temperature", "number"},
      {"temperature too high", "POST", "/v1/chat/completions", chat_with({{"temperature", 5}}), 400, "invalid_request_error", "temperature", "outside"},
      {"top_p too high", "POST", "/v1/chat/completions", chat_with({{"top_p", 1.5}}), 400, "invalid_request_error", "top_p", "outside"},
      {"top_k negative", "POST", "/v1/chat/completions", chat_with({{"top_k", -1}}), 400, "invalid_request_error", "top_k", "outside"},
      {"seed float", "POST", "/v1/chat/completions", chat_with({{"seed", 1.5}}), 400, "invalid_request_error", "seed", "integer"},
      {"n = 2", "POST", "/v1/chat/completions", chat_with({{"n", 2}}), 400, "invalid_request_error", "n", "n = 1"},
      {"stop wrong type", "POST", "/v1/chat/completions", chat_with({{"stop", {1, 2}}}), 400, "invalid_request_error", "stop", "string"},
      {"stream not bool", "POST", "/v1/chat/completions", chat_with({{"stream", "yes"}}), 400, "invalid_request_error", "stream", "true or false"},
      {"enable_thinking not bool", "POST", "/v1/chat/completions", chat_with({{"chat_template_kwargs", {{"enable_thinking", "no"}}}}), 400, "invalid_request_error", "chat_template_kwargs.enable_thinking", "true or false"},
      {"reasoning_effort unknown", "POST", "/v1/chat/completions", chat_with({{"reasoning_effort", "max"}}), 400, "invalid_request_error", "reasoning_effort", "not one of"},
      {"tools not a list", "POST", "/v1/chat/completions", chat_with({{"tools", "all"}}), 400, "invalid_request_error", "tools", "list"},
      {"tool without name", "POST", "/v1/chat/completions", chat_with({{"tools", {{{"type", "function"}, {"function", {{"parameters", json::object()}}}}}}}), 400, "invalid_request_error", "tools[0]", "name"},
      {"tool_choice required without tools", "POST", "/v1/chat/completions", chat_with({{"tool_choice", "required"}}), 400, "invalid_request_error", "tool_choice", "no tools"},
      {"tool_choice names an unknown tool", "POST", "/v1/chat/completions",
       chat_with({{"tools", {{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}},
                  {"tool_choice", {{"type", "function"}, {"function", {{"name", "send_mail"}}}}}}),
       400, "invalid_request_error", "tool_choice", "send_mail"},
      {"logit_bias not an object", "POST", "/v1/chat/completions", chat_with({{"logit_bias", {1, 2}}}), 400, "invalid_request_error", "logit_bias", "object"},
      {"logit_bias key not an id", "POST", "/v1/chat/completions", chat_with({{"logit_bias", {{"abc", 1}}}}), 400, "invalid_request_error", "logit_bias", "abc"},
      {"logit_bias out of range", "POST", "/v1/chat/completions", chat_with({{"logit_bias", {{"5", 300}}}}), 400, "invalid_request_error", "logit_bias", "[-100, 100]"},
      {"logit_bias past the vocabulary", "POST", "/v1/chat/completions", chat_with({{"logit_bias", {{"99999", 1}}}}), 400, "invalid_request_error", "logit_bias", "outside the vocabulary"},
      {"response_format json_schema without a schema", "POST", "/v1/chat/completions", chat_with({{"response_format", {{"type", "json_schema"}}}}), 400, "invalid_request_error", "response_format", "needs json_schema.schema"},
      {"response_format json_schema with a pattern", "POST", "/v1/chat/completions",
       chat_with({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "z"}, {"schema", {{"type", "object"}, {"properties", {{"zip", {{"type", "string"}, {"pattern", "[0-9]+"}}}}}}}}}}}}),
       400, "invalid_request_error", "response_format", "'pattern' is not enforced (at \"#/properties/zip/pattern\")"},
      {"response_format json_schema of a string", "POST", "/v1/chat/completions",
       chat_with({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", {{"type", "string"}}}}}}}}),
       400, "invalid_request_error", "response_format", "the root must be an object"},
      {"logprobs not a boolean", "POST", "/v1/chat/completions", chat_with({{"logprobs", 1}}), 400, "invalid_request_error", "logprobs", "true or false"},
      {"tool_choice unknown string", "POST", "/v1/chat/completions", chat_with({{"tool_choice", "always"}}), 400, "invalid_request_error", "tool_choice", "required"},
      {"unknown model", "POST", "/v1/chat/completions", chat_with({{"model", "gpt-4o"}}), 404, "invalid_request_error", "model", "gpt-4o"},
      {"model not a string", "POST", "/v1/chat/completions", chat_with({{"model", 7}}), 400, "invalid_request_error", "model", "string"},
      {"prompt + max_tokens over the context", "POST", "/v1/chat/completions", chat_with({{"max_tokens", 600}}), 400, "invalid_request_error", "max_tokens", "the context is 512"},
      {"completion prompt missing", "POST", "/v1/completions", R"({"max_tokens": 4})", 400, "invalid_request_error", "prompt", "required"},
      {"completion prompt number", "POST", "/v1/completions", R"({"prompt": 12})", 400, "invalid_request_error", "prompt", "string"},
      {"completion prompt empty", "POST", "/v1/completions", R"({"prompt": ""})", 400, "invalid_request_error", "prompt", "empty"},
      {"unknown route", "POST", "/v1/embeddings", "{}", 404, "invalid_request_error", nullptr, "/v1/embeddings"},
      {"wrong method on chat", "GET", "/v1/chat/completions", "", 405, "invalid_request_error", nullptr, "use POST"},
      {"wrong method on models", "POST", "/v1/models", "{}", 405, "invalid_request_error", nullptr, "use GET"},
      {"body over the limit", "POST", "/v1/completions", std::string(5000, 'x'), 413, "invalid_request_error", nullptr, "4096 bytes"},
      {"number too large for a double", "POST", "/v1/chat/completions", R"({"temperature": 1e999})", 400, "invalid_request_error", nullptr, "not valid JSON"},
      {"nested too deep", "POST", "/v1/chat/completions", R"({"x": )" + std::string(200, '[') + std::string(200, ']') + "}", 400, "invalid_request_error", nullptr, "128 levels"},
      {"tool_choice type a number", "POST", "/v1/chat/completions",
       chat_with({{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}, {"tool_choice", {{"type", 5}, {"function", {{"name", "f"}}}}}}),
       400, "invalid_request_error", "tool_choice", "is not"},
      {"response_format type a number", "POST", "/v1/chat/completions", chat_with({{"response_format", {{"type", 1}}}}), 400, "invalid_request_error", "response_format", "not supported"},
      {"top_logprobs false", "POST", "/v1/chat/completions", chat_with({{"top_logprobs", false}}), 400, "invalid_request_error", "top_logprobs", "integer"},
      {"completion logprobs over 5", "POST", "/v1/completions", R"({"prompt": "a", "logprobs": 6})", 400, "invalid_request_error", "logprobs", "[0, 5]"},
      {"completion echo", "POST", "/v1/completions", R"({"prompt": "a", "echo": true})", 400, "invalid_request_error", "echo", "not supported"},
      {"completion suffix", "POST", "/v1/completions", R"({"prompt": "a", "suffix": "b"})", 400, "invalid_request_error", "suffix", "not supported"},
      {"completion best_of", "POST", "/v1/completions", R"({"prompt": "a", "best_of": 3})", 400, "invalid_request_error", "best_of", "not supported"},
      {"model by id unknown", "GET", "/v1/models/gpt-4o", "", 404, "invalid_request_error", "model", "gpt-4o"},
      {"functions (the older tools)", "POST", "/v1/chat/completions", chat_with({{"functions", json::array({{{"name", "f"}}})}}), 400, "invalid_request_error", "functions", "send tools"},
      {"function_call", "POST", "/v1/chat/completions", chat_with({{"function_call", "auto"}}), 400, "invalid_request_error", "function_call", "send tools"},
  };
}

TEST(ServerErrors, EachMalformedRequestGetsItsStatusAndType) {
  server::ServerOptions o;
  o.max_body_bytes = 4096;
  TestServer s(o);
  const auto cases = bad_requests();
  ASSERT_GE(cases.size(), 20u);
  for (const BadRequest& c : cases) {
    SCOPED_TRACE(c.name);
    auto res = s.send(c.method, c.path, c.body);
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, c.status) << res->body;
    json body;
    ASSERT_NO_THROW(body = json::parse(res->body)) << res->body;
    ASSERT_TRUE(body.contains("error")) << res->body;
    const json& e = body["error"];
    EXPECT_EQ(e["type"], c.type);
    for (const char* key : {"message", "type", "param", "code"}) EXPECT_TRUE(e.contains(key)) << key;
    if (c.param) EXPECT_EQ(e["param"], c.param);
    EXPECT_NE(e["message"].get<std::string>().find(c.message), std::string::npos) << e["message"];
  }
  // Still serving after all of that; and the limits leave room: nesting of 100 and objects of 4,096
  // keys, a legacy completion's logprobs of 0, echo false, best_of 1.
  const json ok = s.post_json("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}, {"logprobs", 0}, {"echo", false},
                                                  {"best_of", 1}, {"suffix", ""}});
  EXPECT_EQ(ok["object"], "text_completion");
  auto deep = s.send("POST", "/v1/completions", R"({"prompt": "a", "max_tokens": 1, "x": )" + std::string(100, '[') +
                                                    std::string(100, ']') + "}");
  ASSERT_TRUE(deep);
  EXPECT_EQ(deep->status, 200) << deep->body;
  const json model_404 = s.post_json("/v1/completions", {{"prompt", "a"}, {"model", "x"}}, 404);
  EXPECT_EQ(model_404["error"]["code"], "model_not_found");
}

// JSON that would cost more than its bytes is refused before anything reads it: nesting deeper than
// 128 (the library's dump recurses) and objects of more than 4,096 keys (an ordered object's inserts
// are linear); up to those limits it is taken. A number too large for a double is the client's
// mistake too (it used to be a 500).
TEST(ServerErrors, JsonThatCostsMoreThanItsBytesIsRefused) {
  TestServer s;
  const auto status_of = [&](const std::string& body) {
    auto res = s.send("POST", "/v1/chat/completions", body);
    EXPECT_TRUE(res);
    return res ? res->status : 0;
  };
  const auto nested = [](int depth) {
    return R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "x": )" + std::string(size_t(depth), '[') +
           std::string(size_t(depth), ']') + "}";
  };
  EXPECT_EQ(status_of(nested(120)), 200);
  EXPECT_EQ(status_of(nested(130)), 400);
  // max_tokens nested 100,000 deep took the server down: its error message dumped the value, recursively.
  EXPECT_EQ(status_of(R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": )" + std::string(100000, '[') +
                      std::string(100000, ']') + "}"),
            400);
  const auto keys = [](int n) {
    std::string body = R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "x": {)";
    for (int i = 0; i < n; ++i) body += fmt::format("{}\"k{}\": 0", i ? ", " : "", i);
    return body + "}}";
  };
  EXPECT_EQ(status_of(keys(4096)), 200);
  const auto res = s.send("POST", "/v1/chat/completions", keys(4097));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("more than 4096 keys"), std::string::npos) << res->body;
}

// What the server answers a request sent as raw bytes (the whole request; the server closes).
std::string raw_reply(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "no socket";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(uint16_t(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0 &&
      ::send(fd, request.data(), request.size(), 0) == ssize_t(request.size())) {
    char buffer[4096];
    for (ssize_t n; (n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0;) reply.append(buffer, size_t(n));
  }
  ::close(fd);
  return reply;
}

// A request with a method that carries a body (POST, PUT, PATCH) whose headers say nothing of its
// length (no Content-Length, not chunked): a route that reads bodies gets 411, saying so (it read
// as broken chunked framing); any other path its 405 or 404 at once, not a 400 after httplib has
// waited for the connection to close (5 s) to read a body no route wants.
TEST(ServerErrors, ABodyOfNoStatedLengthIs411) {
  TestServer s;
  const auto request = [](const std::string& line) {
    return line + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n";
  };
  std::string reply = raw_reply(s.port, request("POST /v1/completions"));
  EXPECT_EQ(reply.rfind("HTTP/1.1 411", 0), 0u) << reply;
  EXPECT_NE(reply.find("no Content-Length"), std::string::npos) << reply;
  reply = raw_reply(s.port, request("POST /health"));
  EXPECT_EQ(reply.rfind("HTTP/1.1 405", 0), 0u) << reply;
  EXPECT_NE(reply.find("Allow: GET"), std::string::npos) << reply;
  reply = raw_reply(s.port, request("PUT /v1/chat/completions"));
  EXPECT_EQ(reply.rfind("HTTP/1.1 405", 0), 0u) << reply;
  EXPECT_NE(reply.find("Allow: POST"), std::string::npos) << reply;
  reply = raw_reply(s.port, request("PATCH /v1/nothing"));
  EXPECT_EQ(reply.rfind("HTTP/1.1 404", 0), 0u) << reply;
  EXPECT_NE(reply.find("unknown_route"), std::string::npos) << reply;
}

// How a reply ended, as each API names it: a limit is "length" (OpenAI) or "max_tokens"
// (Anthropic) even with tool calls, which it may have cut short; tool calls otherwise.
TEST(ServerErrors, ALimitIsReportedEvenWithToolCalls) {
  using engine::FinishReason;
  EXPECT_STREQ(server::finish_reason(FinishReason::length, true), "length");
  EXPECT_STREQ(server::finish_reason(FinishReason::context_full, true), "length");
  EXPECT_STREQ(server::finish_reason(FinishReason::end_of_generation, true), "tool_calls");
  EXPECT_STREQ(server::finish_reason(FinishReason::end_of_generation, false), "stop");
  EXPECT_STREQ(server::stop_reason(FinishReason::length, true), "max_tokens");
  EXPECT_STREQ(server::stop_reason(FinishReason::end_of_generation, true), "tool_use");
  EXPECT_STREQ(server::stop_reason(FinishReason::stop_string, false), "stop_sequence");
}

// The body limit holds however a body arrives: chunked, or compressed, where it counts the bytes
// decompressed (a gzip body of a few hundred bytes used to grow to any size unchecked). Bodies within
// the limit are served either way.
TEST(ServerErrors, TheBodyLimitHoldsForChunkedAndCompressedBodies) {
  server::ServerOptions o;
  o.max_body_bytes = 4096;
  TestServer s(o);
  const std::string small = json{{"prompt", "a"}, {"max_tokens", 1}}.dump();
  const std::string large = json{{"prompt", std::string(5000, 'a')}, {"max_tokens", 1}}.dump();
  httplib::Client compressed = s.client();
  compressed.set_compress(true);
  const auto chunked = [&](const std::string& body) {
    return s.client().Post(
        "/v1/completions",
        [body](size_t, httplib::DataSink& sink) {
          for (size_t at = 0; at < body.size(); at += 1000) sink.write(body.data() + at, std::min<size_t>(1000, body.size() - at));
          sink.done();
          return true;
        },
        "application/json");
  };
  for (const auto& [how, res] : {std::pair{"gzip", compressed.Post("/v1/completions", small, "application/json")},
                                 std::pair{"chunked", chunked(small)}}) {
    ASSERT_TRUE(res) << how;
    EXPECT_EQ(res->status, 200) << how << ": " << res->body;
  }
  for (const auto& [how, res] : {std::pair{"gzip", compressed.Post("/v1/completions", large, "application/json")},
                                 std::pair{"chunked", chunked(large)}}) {
    ASSERT_TRUE(res) << how;
    EXPECT_EQ(res->status, 413) << how << ": " << res->body;
    EXPECT_NE(res->body.find("4096 bytes"), std::string::npos) << how << ": " << res->body;
  }
  EXPECT_EQ(s.post_json("/v1/completions", json::parse(small))["object"], "text_completion");
}

}  // namespace
}  // namespace lode::test
