// POST /v1/messages (Anthropic Messages) against an in-process `lode serve` on lode-mini: plain and
// streamed replies equal to engine::generate at temperature 0, the stream's event order, thinking
// on and off, stop sequences, tool_use (through the fake-output hook), the mapping of tool_use /
// tool_result conversations, API keys, and malformed requests answered with Anthropic error bodies.
#include "chat/output_parser.h"
#include "chat/template.h"
#include "cpu/engine.h"
#include "engine/generate.h"
#include "server/anthropic_request.h"
#include "test_server_support.h"

namespace lode::test {
namespace {

struct Reference {
  std::vector<int32_t> prompt;
  chat::ParsedDelta parsed;
  engine::GenerateResult result;
};

// What the engine itself says for a chat at temperature 0, parsed as the server parses it.
Reference reference(const std::vector<chat::Message>& messages, bool thinking, int64_t max_tokens) {
  auto model = mini_model();
  const std::string text = chat::render_qwen35(messages, nullptr, {.add_generation_prompt = true, .enable_thinking = thinking});
  Reference r;
  r.prompt = model->tokenizer.encode(text, true);
  cpu::Session session(model->reader, model->config, {.threads = 1, .max_context = 512});
  engine::GenerateOptions g;
  g.max_tokens = max_tokens;
  g.sampling.temperature = 0;
  sample::Sampler sampler(g.sampling, session.vocab());
  std::string out;
  r.result = engine::generate(*cpu::borrow_sequence(session), model->tokenizer, sampler, r.prompt, g, [&](std::string_view t) { out += t; });
  chat::OutputParser parser(thinking, nullptr);
  r.parsed = parser.push(out);
  chat::ParsedDelta rest = parser.finish();
  r.parsed.reasoning += rest.reasoning;
  r.parsed.content += rest.content;
  return r;
}

std::vector<chat::Message> user_says(const std::string& text) { return {{.role = "user", .content = text}}; }

json messages_body(const std::string& user, int max_tokens) {
  return {{"model", "lode-mini"}, {"max_tokens", max_tokens}, {"temperature", 0},
          {"messages", {{{"role", "user"}, {"content", user}}}}};
}

const char* expected_stop_reason(const engine::GenerateResult& r) {
  return r.finish == engine::FinishReason::length ? "max_tokens" : "end_turn";
}

// The text of each kind of block in a reply's content.
struct Blocks {
  std::string thinking, text;
  std::vector<json> tool_uses;
};

Blocks blocks_of(const json& content) {
  Blocks b;
  for (const json& block : content) {
    if (block["type"] == "thinking") {
      b.thinking += block["thinking"].get<std::string>();
      EXPECT_EQ(block["signature"], "");
    } else if (block["type"] == "text") {
      b.text += block["text"].get<std::string>();
    } else if (block["type"] == "tool_use") {
      b.tool_uses.push_back(block);
    } else {
      ADD_FAILURE() << "unexpected block " << block.dump();
    }
  }
  return b;
}

// A streamed reply put back together, checking the event grammar on the way: message_start,
// then blocks (start, deltas of the block's own kind and index, stop) with increasing indices,
// then message_delta and message_stop.
struct StreamedMessage {
  json start;
  std::vector<json> content;  // the blocks, rebuilt
  json message_delta;
};

StreamedMessage read_message_stream(const std::string& body) {
  StreamedMessage out;
  const std::vector<json> events = sse_typed_events(body);
  EXPECT_GE(events.size(), 3u);
  if (events.size() < 3) return out;
  EXPECT_EQ(events.front()["type"], "message_start");
  out.start = events.front()["message"];
  EXPECT_EQ(events.back()["type"], "message_stop");
  EXPECT_EQ(events[events.size() - 2]["type"], "message_delta");
  out.message_delta = events[events.size() - 2];
  bool open = false;
  std::string tool_json;
  for (size_t i = 1; i + 2 < events.size(); ++i) {
    const json& e = events[i];
    SCOPED_TRACE(e.dump());
    if (e["type"] == "content_block_start") {
      EXPECT_FALSE(open);
      EXPECT_EQ(e["index"], out.content.size());
      out.content.push_back(e["content_block"]);
      open = true;
      tool_json.clear();
    } else if (e["type"] == "content_block_delta") {
      EXPECT_TRUE(open);
      if (!open) continue;
      EXPECT_EQ(e["index"], out.content.size() - 1);
      json& block = out.content.back();
      const json& d = e["delta"];
      if (d["type"] == "thinking_delta") {
        EXPECT_EQ(block["type"], "thinking");
        block["thinking"] = block["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      } else if (d["type"] == "text_delta") {
        EXPECT_EQ(block["type"], "text");
        block["text"] = block["text"].get<std::string>() + d["text"].get<std::string>();
      } else {
        EXPECT_EQ(d["type"], "input_json_delta");
        EXPECT_EQ(block["type"], "tool_use");
        tool_json += d["partial_json"].get<std::string>();
      }
    } else {
      EXPECT_EQ(e["type"], "content_block_stop");
      EXPECT_TRUE(open);
      EXPECT_EQ(e["index"], out.content.size() - 1);
      if (out.content.back()["type"] == "tool_use") {
        EXPECT_EQ(out.content.back()["input"], json::object());  // the start carries an empty input
        out.content.back()["input"] = json::parse(tool_json);
      }
      open = false;
    }
  }
  EXPECT_FALSE(open);
  return out;
}

httplib::Result post_stream(const TestServer& s, json body, const httplib::Headers& headers = {}) {
  body["stream"] = true;
  return s.post("/v1/messages", body.dump(), headers);
}

TEST(ServerAnthropic, MessageEqualsGenerateAndStreamEqualsPlain) {
  TestServer s;
  const std::string user = "What does the ls command do?";
  const Reference ref = reference(user_says(user), /*thinking=*/false, 24);  // thinking is off by default
  ASSERT_FALSE(ref.parsed.content.empty());

  const json reply = s.post_json("/v1/messages", messages_body(user, 24));
  EXPECT_EQ(reply["type"], "message");
  EXPECT_EQ(reply["role"], "assistant");
  EXPECT_EQ(reply["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(reply["model"], "lode-mini");
  const Blocks blocks = blocks_of(reply["content"]);
  EXPECT_EQ(blocks.thinking, ref.parsed.reasoning);
  EXPECT_EQ(blocks.text, ref.parsed.content);
  EXPECT_TRUE(blocks.tool_uses.empty());
  EXPECT_EQ(reply["stop_reason"], expected_stop_reason(ref.result));
  EXPECT_TRUE(reply["stop_sequence"].is_null());
  EXPECT_EQ(reply["usage"]["input_tokens"], ref.prompt.size());
  EXPECT_EQ(reply["usage"]["output_tokens"], ref.result.tokens.size());
  EXPECT_EQ(reply["usage"]["cache_read_input_tokens"], 0);

  auto res = post_stream(s, messages_body(user, 24));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  const StreamedMessage streamed = read_message_stream(res->body);
  EXPECT_EQ(streamed.start["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(streamed.start["content"], json::array());
  EXPECT_TRUE(streamed.start["stop_reason"].is_null());
  EXPECT_EQ(streamed.start["usage"]["input_tokens"], ref.prompt.size());
  EXPECT_EQ(streamed.content, reply["content"]);
  EXPECT_EQ(streamed.message_delta["delta"]["stop_reason"], reply["stop_reason"]);
  EXPECT_TRUE(streamed.message_delta["delta"]["stop_sequence"].is_null());
  EXPECT_EQ(streamed.message_delta["usage"]["output_tokens"], ref.result.tokens.size());
}

TEST(ServerAnthropic, ThinkingEnabledAndDisabled) {
  TestServer s;
  const std::string user = "Where are man pages kept?";
  const Reference ref = reference(user_says(user), /*thinking=*/true, 20);
  ASSERT_FALSE(ref.parsed.reasoning.empty());
  json body = messages_body(user, 20);
  body["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  const json reply = s.post_json("/v1/messages", body);
  ASSERT_GE(reply["content"].size(), 1u);
  EXPECT_EQ(reply["content"][0]["type"], "thinking");  // thinking comes first
  const Blocks blocks = blocks_of(reply["content"]);
  EXPECT_EQ(blocks.thinking, ref.parsed.reasoning);
  EXPECT_EQ(blocks.text, ref.parsed.content);
  EXPECT_EQ(reply["usage"]["input_tokens"], ref.prompt.size());

  auto res = post_stream(s, body);
  ASSERT_TRUE(res);
  EXPECT_EQ(read_message_stream(res->body).content, reply["content"]);

  // Explicitly disabled is the default: the prompt closes the think block.
  const Reference off = reference(user_says(user), /*thinking=*/false, 20);
  json disabled = messages_body(user, 20);
  disabled["thinking"] = {{"type", "disabled"}};
  const json plain = s.post_json("/v1/messages", disabled);
  EXPECT_EQ(plain["usage"]["input_tokens"], off.prompt.size());
  EXPECT_EQ(blocks_of(plain["content"]).text, off.parsed.content);
  EXPECT_EQ(plain["content"], s.post_json("/v1/messages", messages_body(user, 20))["content"]);
}

TEST(ServerAnthropic, SystemPromptAndStopSequence) {
  TestServer s;
  const std::string user = "Hello";
  std::vector<chat::Message> conversation = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = user}};
  const Reference ref = reference(conversation, false, 24);
  json body = messages_body(user, 24);
  body["system"] = json::array({{{"type", "text"}, {"text", "Be "}}, {{"type", "text"}, {"text", "brief."}}});
  const json reply = s.post_json("/v1/messages", body);
  EXPECT_EQ(reply["usage"]["input_tokens"], ref.prompt.size());
  const std::string text = blocks_of(reply["content"]).text;
  EXPECT_EQ(text, ref.parsed.content);
  ASSERT_GE(text.size(), 10u) << text;

  const std::string stop = text.substr(text.size() / 2, 3);
  body["stop_sequences"] = {"\x01never", stop};
  const json cut = s.post_json("/v1/messages", body);
  EXPECT_EQ(blocks_of(cut["content"]).text, text.substr(0, text.find(stop))) << "stop " << stop;
  EXPECT_EQ(cut["stop_reason"], "stop_sequence");
  EXPECT_EQ(cut["stop_sequence"], stop);
  auto res = post_stream(s, body);
  ASSERT_TRUE(res);
  const StreamedMessage streamed = read_message_stream(res->body);
  EXPECT_EQ(streamed.content, cut["content"]);
  EXPECT_EQ(streamed.message_delta["delta"]["stop_reason"], "stop_sequence");
  EXPECT_EQ(streamed.message_delta["delta"]["stop_sequence"], stop);
}

const json kWeatherTool = {{"name", "get_weather"},
                           {"description", "Weather for a city"},
                           {"input_schema", {{"type", "object"},
                                             {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}},
                                             {"required", {"city"}}}}};

TEST(ServerAnthropic, ToolUseThroughTheFakeOutputHook) {
  server::ServerOptions o;
  o.worker.fake_output = "The user wants the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
                         "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  TestServer s(o);
  json body = messages_body("Weather in Paris for 3 days?", 16);
  body["tools"] = json::array({kWeatherTool});
  body["thinking"] = {{"type", "enabled"}, {"budget_tokens", 2048}};
  const json reply = s.post_json("/v1/messages", body);
  EXPECT_EQ(reply["stop_reason"], "tool_use");
  ASSERT_EQ(reply["content"].size(), 2u) << reply.dump();
  EXPECT_EQ(reply["content"][0], json({{"type", "thinking"}, {"thinking", "The user wants the weather."}, {"signature", ""}}));
  const json& call = reply["content"][1];
  EXPECT_EQ(call["type"], "tool_use");
  EXPECT_EQ(call["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(call["input"], json({{"city", "Paris"}, {"days", 3}}));

  auto res = post_stream(s, body);
  ASSERT_TRUE(res);
  const StreamedMessage streamed = read_message_stream(res->body);
  ASSERT_EQ(streamed.content.size(), 2u);
  EXPECT_EQ(streamed.content[0], reply["content"][0]);
  EXPECT_EQ(streamed.content[1]["name"], "get_weather");
  EXPECT_EQ(streamed.content[1]["input"], call["input"]);
  EXPECT_EQ(streamed.content[1]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(streamed.message_delta["delta"]["stop_reason"], "tool_use");

  body["tool_choice"] = {{"type", "auto"}};
  EXPECT_EQ(s.post_json("/v1/messages", body)["stop_reason"], "tool_use");
}

// tool_choice {type: "tool", name} steers the reply into a call of that tool (thinking off, as
// Anthropic's default): its text starts "<tool_call>\n<function=NAME>\n"; lode-mini's arguments are
// not a well-formed call, so it comes back as text.
TEST(ServerAnthropic, ToolChoiceToolStartsACallOfThatTool) {
  TestServer s;
  json body = messages_body("Weather in Paris?", 40);
  body["tools"] = json::array({kWeatherTool, {{"name", "list_files"}, {"input_schema", {{"type", "object"}}}}});
  body["tool_choice"] = {{"type", "tool"}, {"name", "list_files"}};
  const json reply = s.post_json("/v1/messages", body);
  const Blocks b = blocks_of(reply["content"]);
  EXPECT_EQ(b.text.rfind("<tool_call>\n<function=list_files>\n", 0), 0u) << reply.dump();
  body["tool_choice"] = {{"type", "tool"}, {"name", "send_mail"}};
  EXPECT_EQ(s.post_json("/v1/messages", body, 400)["error"]["type"], "invalid_request_error");
}

// A tool round trip in Anthropic's shape, and the same conversation written out as chat messages.
json tool_round_trip_body() {
  return {{"max_tokens", 8}, {"temperature", 0}, {"system", "You answer with tools."}, {"tools", json::array({kWeatherTool})},
          {"messages", json::array({
              {{"role", "user"}, {"content", "Weather in Paris?"}},
              {{"role", "assistant"}, {"content", json::array({
                  {{"type", "thinking"}, {"thinking", "I should call the tool."}, {"signature", "x"}},
                  {{"type", "text"}, {"text", "Let me check."}},
                  {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_weather"}, {"input", {{"city", "Paris"}}}}})}},
              {{"role", "user"}, {"content", json::array({
                  {{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "Sunny, 21 C"}},
                  {{"type", "text"}, {"text", "Thanks! "}}, {{"type", "text"}, {"text", "And tomorrow?"}}})}}})}};
}

std::vector<chat::Message> tool_round_trip_messages() {
  chat::Message assistant{.role = "assistant", .content = "Let me check.", .reasoning_content = "I should call the tool."};
  assistant.tool_calls.push_back({.id = "toolu_1", .name = "get_weather", .arguments = {{"city", "Paris"}}});
  return {{.role = "system", .content = "You answer with tools."}, {.role = "user", .content = "Weather in Paris?"},
          assistant, {.role = "tool", .content = "Sunny, 21 C"}, {.role = "user", .content = "Thanks! And tomorrow?"}};
}

TEST(ServerAnthropic, ToolResultRoundTripMapsToChatMessages) {
  const server::ChatRequest request = server::parse_messages_request(tool_round_trip_body(), server::ModelNames("lode-mini"), 7);
  const std::vector<chat::Message> expected = tool_round_trip_messages();
  ASSERT_EQ(request.messages.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(request.messages[i].role, expected[i].role);
    EXPECT_EQ(request.messages[i].content, expected[i].content);
    EXPECT_EQ(request.messages[i].reasoning_content, expected[i].reasoning_content);
    ASSERT_EQ(request.messages[i].tool_calls.size(), expected[i].tool_calls.size());
    for (size_t k = 0; k < expected[i].tool_calls.size(); ++k) {
      EXPECT_EQ(request.messages[i].tool_calls[k].id, expected[i].tool_calls[k].id);
      EXPECT_EQ(request.messages[i].tool_calls[k].name, expected[i].tool_calls[k].name);
      EXPECT_EQ(request.messages[i].tool_calls[k].arguments, expected[i].tool_calls[k].arguments);
    }
  }
  const json openai_tools = json::array({{{"type", "function"},
                                          {"function", {{"name", "get_weather"}, {"description", "Weather for a city"},
                                                        {"parameters", kWeatherTool["input_schema"]}}}}});
  EXPECT_EQ(request.tools, openai_tools);
  EXPECT_FALSE(request.enable_thinking);
  EXPECT_EQ(request.generation.max_tokens, 8);

  // Through the server, the prompt is the one the template makes of those messages.
  TestServer s;
  const std::string text = chat::render_qwen35(expected, openai_tools, {.add_generation_prompt = true, .enable_thinking = false});
  ASSERT_NE(text.find("<tool_response>\nSunny, 21 C\n</tool_response>"), std::string::npos) << text;
  const json reply = s.post_json("/v1/messages", tool_round_trip_body());
  EXPECT_EQ(reply["usage"]["input_tokens"], mini_model()->tokenizer.encode(text, true).size());
}

TEST(ServerAnthropic, ApiKeyByHeaderOrBearer) {
  server::ServerOptions o;
  o.api_key = "sekrit";
  TestServer s(o);
  const std::string body = messages_body("Hi", 1).dump();
  for (const httplib::Headers& bad : {httplib::Headers{}, httplib::Headers{{"x-api-key", "nope"}},
                                      httplib::Headers{{"Authorization", "Bearer nope"}}}) {
    auto res = s.post("/v1/messages", body, bad);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401);
    const json e = json::parse(res->body);
    EXPECT_EQ(e["type"], "error");
    EXPECT_EQ(e["error"]["type"], "authentication_error");
  }
  EXPECT_EQ(s.post("/v1/messages", body, {{"x-api-key", "sekrit"}, {"anthropic-version", "2023-06-01"}})->status, 200);
  EXPECT_EQ(s.post("/v1/messages", body, {{"Authorization", "Bearer sekrit"}})->status, 200);
}

struct BadMessages {
  const char* name;
  const char* method;
  std::string body;
  int status;
  const char* type;     // Anthropic's error type
  const char* message;  // a piece the message must contain
};

std::string with(const json& extra) {
  json body = messages_body("hi", 4);
  for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  return body.dump();
}

std::string without_max_tokens() {
  json body = messages_body("hi", 4);
  body.erase("max_tokens");
  return body.dump();
}

std::vector<BadMessages> bad_messages() {
  const char* invalid = "invalid_request_error";
  return {
      {"malformed JSON", "POST", R"({"messages": [)", 400, invalid, "not valid JSON"},
      {"body not an object", "POST", "[1]", 400, invalid, "JSON object"},
      {"max_tokens missing", "POST", without_max_tokens(), 400, invalid, "max_tokens is required"},
      {"max_tokens zero", "POST", with({{"max_tokens", 0}}), 400, invalid, "max_tokens"},
      {"messages missing", "POST", R"({"max_tokens": 4})", 400, invalid, "messages is required"},
      {"messages empty", "POST", with({{"messages", json::array()}}), 400, invalid, "must not be empty"},
      {"role system in messages", "POST", with({{"messages", {{{"role", "system"}, {"content", "x"}}}}}), 400, invalid, "\"user\" or \"assistant\""},
      {"content missing", "POST", with({{"messages", {{{"role", "user"}}}}}), 400, invalid, "content is required"},
      {"content a number", "POST", with({{"messages", {{{"role", "user"}, {"content", 3}}}}}), 400, invalid, "content must be"},
      {"block without type", "POST", with({{"messages", {{{"role", "user"}, {"content", {{{"text", "hi"}}}}}}}}), 400, invalid, "\"type\""},
      {"image block", "POST", with({{"messages", {{{"role", "user"}, {"content", {{{"type", "image"}, {"source", json::object()}}}}}}}}), 400, invalid, "\"image\""},
      {"tool_use in a user message", "POST", with({{"messages", {{{"role", "user"}, {"content", {{{"type", "tool_use"}, {"id", "a"}, {"name", "f"}, {"input", json::object()}}}}}}}}), 400, invalid, "tool_use"},
      {"tool_result without id", "POST", with({{"messages", {{{"role", "user"}, {"content", {{{"type", "tool_result"}, {"content", "x"}}}}}}}}), 400, invalid, "tool_use_id"},
      {"tool_use input not an object", "POST", with({{"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", {{{"type", "tool_use"}, {"id", "a"}, {"name", "f"}, {"input", "x"}}}}}, {{"role", "user"}, {"content", "ok"}}}}}), 400, invalid, "input must be an object"},
      {"system a number", "POST", with({{"system", 5}}), 400, invalid, "system"},
      {"temperature above 1", "POST", with({{"temperature", 1.5}}), 400, invalid, "temperature"},
      {"top_k negative", "POST", with({{"top_k", -3}}), 400, invalid, "top_k"},
      {"stop_sequences a string", "POST", with({{"stop_sequences", "x"}}), 400, invalid, "stop_sequences"},
      {"stream not bool", "POST", with({{"stream", "yes"}}), 400, invalid, "true or false"},
      {"thinking without budget", "POST", with({{"thinking", {{"type", "enabled"}}}}), 400, invalid, "budget_tokens"},
      {"thinking unknown type", "POST", with({{"thinking", {{"type", "deep"}}}}), 400, invalid, "deep"},
      {"tool without input_schema", "POST", with({{"tools", {{{"name", "f"}}}}}), 400, invalid, "input_schema"},
      {"tool_choice any without tools", "POST", with({{"tool_choice", {{"type", "any"}}}}), 400, invalid, "no tools"},
      {"tool_choice tool without a name", "POST", with({{"tool_choice", {{"type", "tool"}}}}), 400, invalid, "name"},
      {"tool_choice a string", "POST", with({{"tool_choice", "auto"}}), 400, invalid, "tool_choice"},
      {"user content empty", "POST", with({{"messages", {{{"role", "user"}, {"content", json::array()}}}}}), 400, invalid, "must not be empty"},
      {"no user message", "POST", with({{"messages", {{{"role", "assistant"}, {"content", "hi"}}}}}), 400, invalid, "No user query found"},
      {"prompt + max_tokens over the context", "POST", with({{"max_tokens", 600}}), 400, invalid, "the context is 512"},
      {"unknown model", "POST", with({{"model", "claude-sonnet-4"}}), 404, "not_found_error", "claude-sonnet-4"},
      {"wrong method", "GET", "", 405, invalid, "use POST"},
      {"body over the limit", "POST", std::string(5000, ' '), 413, "request_too_large", "4096 bytes"},
  };
}

TEST(ServerAnthropic, MalformedRequestsGetAnthropicErrors) {
  server::ServerOptions o;
  o.max_body_bytes = 4096;
  TestServer s(o);
  const auto cases = bad_messages();
  ASSERT_GE(cases.size(), 10u);
  for (const BadMessages& c : cases) {
    SCOPED_TRACE(c.name);
    auto res = s.send(c.method, "/v1/messages", c.body);
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, c.status) << res->body;
    json body;
    ASSERT_NO_THROW(body = json::parse(res->body)) << res->body;
    EXPECT_EQ(body["type"], "error") << res->body;
    ASSERT_TRUE(body.contains("error") && body["error"].is_object()) << res->body;
    EXPECT_EQ(body["error"]["type"], c.type);
    EXPECT_NE(body["error"].value("message", "").find(c.message), std::string::npos) << body["error"]["message"];
  }
  // Still serving; and the OpenAI routes keep their own error shape.
  EXPECT_EQ(s.post_json("/v1/messages", messages_body("hi", 2))["type"], "message");
  EXPECT_TRUE(s.post_json("/v1/chat/completions", json{{"messages", json::array()}}, 400)["error"].contains("param"));
}

// POST /v1/messages/count_tokens: the prompt's length as /v1/messages renders it (system, tools and
// thinking included), without max_tokens; errors in Anthropic's shape.
TEST(ServerAnthropic, CountTokensIsThePromptsLength) {
  TestServer s;
  json body = messages_body("Tell me about the shell.", 4);
  body["system"] = "Answer briefly.";
  body["tools"] = {{{"name", "get_weather"}, {"description", "The weather"}, {"input_schema", {{"type", "object"}}}}};
  json counted = body;
  counted.erase("max_tokens");
  counted.erase("temperature");
  const json count = s.post_json("/v1/messages/count_tokens", counted);
  ASSERT_TRUE(count.contains("input_tokens")) << count;
  EXPECT_EQ(count["input_tokens"], s.post_json("/v1/messages", body)["usage"]["input_tokens"]);
  EXPECT_GT(count["input_tokens"].get<int>(), 20);
  counted["thinking"] = {{"type", "enabled"}, {"budget_tokens", 100}};  // the thinking prompt differs
  EXPECT_NE(s.post_json("/v1/messages/count_tokens", counted)["input_tokens"], count["input_tokens"]);
  counted["model"] = "claude-sonnet-4";
  EXPECT_EQ(s.post_json("/v1/messages/count_tokens", counted, 404)["error"]["type"], "not_found_error");
  EXPECT_EQ(s.post_json("/v1/messages/count_tokens", json{{"messages", 3}}, 400)["type"], "error");
}

// An assistant message last is a prefill: the reply goes on from its content (and holds only what
// follows), equal to the engine's generation from the template's open final turn.
TEST(ServerAnthropic, APrefillIsContinued) {
  TestServer s;
  const std::vector<chat::Message> messages = {{.role = "user", .content = "Tell me about the shell."},
                                               {.role = "assistant", .content = "The shell is"}};
  auto model = mini_model();
  const auto prompt =
      model->tokenizer.encode(chat::render_qwen35(messages, nullptr, {.continue_final_message = true}), true);
  cpu::Session session(model->reader, model->config, {.threads = 1, .max_context = 512});
  engine::GenerateOptions g;
  g.max_tokens = 12;
  g.sampling.temperature = 0;
  sample::Sampler sampler(g.sampling, session.vocab());
  std::string want;
  engine::generate(*cpu::borrow_sequence(session), model->tokenizer, sampler, prompt, g,
                   [&](std::string_view t) { want += t; });
  json body = messages_body("Tell me about the shell.", 12);
  body["messages"].push_back({{"role", "assistant"}, {"content", {{{"type", "text"}, {"text", "The shell is"}}}}});
  const json reply = s.post_json("/v1/messages", body);
  EXPECT_EQ(blocks_of(reply["content"]).text, want);
  EXPECT_EQ(reply["usage"]["input_tokens"], prompt.size());
}

}  // namespace
}  // namespace lode::test
