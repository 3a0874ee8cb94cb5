// The streaming parser of generated text: every way of cutting the text into pushes gives the
// same reasoning, content and tool calls, and calls rendered by the chat template parse back.
#include "chat/output_parser.h"
#include "chat/template.h"

#include <gtest/gtest.h>

namespace {

using lode::chat::OutputParser;
using lode::chat::ToolCall;
using nlohmann::ordered_json;

struct Parsed {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> calls;
};

void collect(Parsed& into, lode::chat::ParsedDelta delta) {
  into.reasoning += delta.reasoning;
  into.content += delta.content;
  for (auto& call : delta.tool_calls) into.calls.push_back(std::move(call));
}

// Feeds `text` cut at `cuts` (increasing byte offsets), then finishes.
Parsed parse_in_pieces(bool thinking_open, const ordered_json& tools, std::string_view text,
                       const std::vector<std::size_t>& cuts) {
  OutputParser parser(thinking_open, tools);
  Parsed parsed;
  std::size_t from = 0;
  for (const std::size_t cut : cuts) {
    collect(parsed, parser.push(text.substr(from, cut - from)));
    from = cut;
  }
  collect(parsed, parser.push(text.substr(from)));
  collect(parsed, parser.finish());
  return parsed;
}

std::string describe(const Parsed& parsed) {
  std::string out = "reasoning=" + ordered_json(parsed.reasoning).dump() +
                    " content=" + ordered_json(parsed.content).dump() + " calls=[";
  for (const ToolCall& call : parsed.calls) {
    out += call.id + ":" + call.name + call.arguments.dump() + " ";
  }
  return out + "]";
}

void expect_parsed(const Parsed& actual, const Parsed& expected, const std::string& how) {
  SCOPED_TRACE(how);
  EXPECT_EQ(describe(actual), describe(expected));
  // describe() prints 1 and 1.0 alike; compare the JSON values too.
  ASSERT_EQ(actual.calls.size(), expected.calls.size());
  for (std::size_t i = 0; i < actual.calls.size(); ++i) {
    EXPECT_EQ(actual.calls[i].arguments, expected.calls[i].arguments);
  }
}

// Whole, one byte at a time, and cut in two at every byte position.
void expect_parsed_however_cut(bool thinking_open, const ordered_json& tools,
                               std::string_view text, const Parsed& expected) {
  expect_parsed(parse_in_pieces(thinking_open, tools, text, {}), expected, "whole");
  std::vector<std::size_t> every_byte;
  for (std::size_t i = 1; i < text.size(); ++i) every_byte.push_back(i);
  expect_parsed(parse_in_pieces(thinking_open, tools, text, every_byte), expected, "bytewise");
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    expect_parsed(parse_in_pieces(thinking_open, tools, text, {cut}), expected,
                  "cut at " + std::to_string(cut));
    if (::testing::Test::HasFailure()) return;  // one failing cut says enough
  }
}

ToolCall call(int id, std::string name, const char* arguments) {
  return {"call_" + std::to_string(id), std::move(name), ordered_json::parse(arguments)};
}

const ordered_json& test_tools() {
  static const ordered_json tools = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"location": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "run_code", "parameters": {"type": "object",
      "properties": {"code": {"type": "string"}, "timeout": {"type": "number"}}}}},
    {"name": "set_flags", "parameters": {"type": "object", "properties": {
      "flags": {"type": "object"}, "on": {"type": "boolean"}, "items": {"type": "array"},
      "note": {"type": ["string", "null"]}, "limit": {"type": ["integer", "string"]}}}}
  ])");
  return tools;
}

struct Case {
  const char* name;
  bool thinking_open;
  std::string text;
  Parsed expected;
};

std::vector<Case> cases() {
  return {
      {"reasoning_then_content", true, "Let me think.\nStep 2.\n</think>\n\nThe answer is 4.",
       {"Let me think.\nStep 2.", "The answer is 4.", {}}},
      {"empty_reasoning", true, "</think>\n\nHi", {"", "Hi", {}}},
      {"reasoning_then_tool_call", true,
       "I need the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
       "<parameter=location>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
       "</function>\n</tool_call>",
       {"I need the weather.", "", {call(0, "get_weather", R"({"location": "Paris", "days": 3})")}}},
      {"content_only_thinking_off", false, "Hello! <b>bold</b> a < b, x<y, </think> stays\n",
       {"", "Hello! <b>bold</b> a < b, x<y, </think> stays\n", {}}},
      {"content_then_two_calls_then_content", false,
       "Checking both.\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nOslo\n"
       "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=run_code>\n"
       "<parameter=code>\nprint(1 < 2)\nif a</b:\n    pass\n</parameter>\n<parameter=timeout>\n"
       "2.5\n</parameter>\n</function>\n</tool_call>\n\nDone.",
       {"", "Checking both.Done.",
        {call(0, "get_weather", R"({"location": "Oslo"})"),
         call(1, "run_code", R"({"code": "print(1 < 2)\nif a</b:\n    pass", "timeout": 2.5})")}}},
      {"values_holding_tags_and_newlines", false,
       "<tool_call>\n<function=run_code>\n<parameter=code>\n\nx = '</tool_call>'\n<tool_call>"
       "</think>\n\n</parameter>\n</function>\n</tool_call>",
       {"", "",
        {call(0, "run_code", R"({"code": "\nx = '</tool_call>'\n<tool_call></think>\n"})")}}},
      {"no_newlines_and_python_literals", false,
       "<tool_call><function=set_flags><parameter=flags>{\"a\": [1, 2.0]}</parameter>"
       "<parameter=on>True</parameter><parameter=items>[\"x\"]</parameter>"
       "<parameter=note>None</parameter><parameter=limit>7</parameter></function></tool_call>",
       {"", "",
        {call(0, "set_flags",
              R"({"flags": {"a": [1, 2.0]}, "on": true, "items": ["x"], "note": null,
                  "limit": 7})")}}},
      {"schema_types_decide", false,
       "<tool_call>\n<function=set_flags>\n<parameter=note>\nNone of it\n</parameter>\n"
       "<parameter=limit>\nunbounded\n</parameter>\n</function>\n</tool_call>"
       "<tool_call>\n<function=get_weather>\n<parameter=location>\n12345\n</parameter>\n"
       "<parameter=days>\nseveral\n</parameter>\n</function>\n</tool_call>",
       {"", "",
        {call(0, "set_flags", R"({"note": "None of it", "limit": "unbounded"})"),
         call(1, "get_weather", R"({"location": "12345", "days": "several"})")}}},
      {"unknown_tool_guesses_json", false,
       "<tool_call>\n<function=other>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\nhello\n"
       "</parameter>\n<parameter=j>\n{\"k\": null}\n</parameter>\n<parameter=b>\nFalse\n"
       "</parameter>\n<parameter=q>\n\"quoted\"\n</parameter>\n</function>\n</tool_call>",
       {"", "",
        {call(0, "other", R"({"n": 42, "s": "hello", "j": {"k": null}, "b": false,
                              "q": "quoted"})")}}},
      {"missing_function_close_is_tolerated", false,
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nRome\n</parameter>\n"
       "</tool_call>",
       {"", "", {call(0, "get_weather", R"({"location": "Rome"})")}}},
      {"malformed_call_is_content", false,
       "Try:\n<tool_call>\n<parameter=x>\n1\n</parameter>\n</tool_call>\nafter",
       {"", "Try:\n<tool_call>\n<parameter=x>\n1\n</parameter>\n</tool_call>\nafter", {}}},
      {"unclosed_parameter_is_content", false,
       "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>",
       {"", "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>", {}}},
      {"unterminated_call_is_content", false,
       "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nPar",
       {"", "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nPar", {}}},
      {"unterminated_reasoning", true, "still thinking <", {"still thinking <", "", {}}},
      {"model_opens_think_itself", false, "<think>\nplan\n</think>\n\nanswer",
       {"plan", "answer", {}}},
      {"think_lookalike_is_content", false, "<thinking is fun", {"", "<thinking is fun", {}}},
      {"partial_tag_at_end", false, "a <tool_ca", {"", "a <tool_ca", {}}},
      {"unicode", true, "日本語で考える 😀\n</think>\n\nélan <b>", {"日本語で考える 😀", "élan <b>", {}}},
  };
}

TEST(ChatOutputParser, SameResultHoweverTheTextIsCut) {
  for (const Case& test : cases()) {
    SCOPED_TRACE(test.name);
    expect_parsed_however_cut(test.thinking_open, test_tools(), test.text, test.expected);
  }
}

TEST(ChatOutputParser, HoldsBackOnlyWhatMightBeATag) {
  OutputParser parser(false, nullptr);
  EXPECT_EQ(parser.push("Hello <").content, "Hello");
  EXPECT_EQ(parser.push("b> and <tool").content, " <b> and");
  const auto at_call = parser.push("_call>\n<function=f>\n</function>\n</tool_call>");
  EXPECT_EQ(at_call.content, "");
  ASSERT_EQ(at_call.tool_calls.size(), 1u);
  EXPECT_EQ(at_call.tool_calls[0].id, "call_0");
  const auto end = parser.finish();
  EXPECT_EQ(end.content, "");
  EXPECT_TRUE(end.tool_calls.empty());
}

// The assistant turn the template writes for `message`, as the model would generate it.
std::string generated_text_of(const lode::chat::Message& message) {
  const std::vector<lode::chat::Message> conversation = {{"user", "go", std::nullopt, {}},
                                                         message};
  const std::string prompt = lode::chat::render_qwen35(conversation, nullptr, {false, true});
  const std::string turn_start = "<|im_start|>assistant\n";
  const std::string turn_end = "<|im_end|>\n";
  std::string text = prompt.substr(prompt.rfind(turn_start) + turn_start.size());
  EXPECT_TRUE(text.ends_with(turn_end));
  return text.substr(0, text.size() - turn_end.size());
}

TEST(ChatOutputParser, ReadsBackCallsTheTemplateWrote) {
  lode::chat::Message message;
  message.role = "assistant";
  message.reasoning_content = "Two calls.";
  message.content = "Running them now.";
  message.tool_calls = {
      {"a", "run_code",
       ordered_json::parse(R"({"code": "def f(x):\n    return x < 2\n", "timeout": 1.0})")},
      {"b", "set_flags",
       ordered_json::parse(R"({"flags": {"z": [1, 2.5, "x"], "a": {"c": null}}, "on": false,
                               "items": [], "note": null, "limit": 12})")},
      {"c", "get_weather", ordered_json::parse(R"({"location": "Zürich \"centre\"", "days": 2})")},
  };
  const std::string text = generated_text_of(message);
  ASSERT_TRUE(text.starts_with("<think>\nTwo calls.\n</think>\n\nRunning them now.\n\n")) << text;
  Parsed expected{*message.reasoning_content, message.content, message.tool_calls};
  for (std::size_t i = 0; i < expected.calls.size(); ++i) {
    expected.calls[i].id = "call_" + std::to_string(i);
  }
  expect_parsed_however_cut(false, test_tools(), text, expected);
}

TEST(ChatOutputParser, ReadsBackUntypedCallsWithoutSchemas) {
  lode::chat::Message message;
  message.role = "assistant";
  message.tool_calls = {{"x", "anything",
                         ordered_json::parse(R"({"count": -3, "ratio": 1e-05, "ok": true,
                                                 "list": [1, {"k": "v"}], "text": "free text"})")}};
  Parsed expected{"", "", message.tool_calls};
  expected.calls[0].id = "call_0";
  expect_parsed_however_cut(false, nullptr, generated_text_of(message), expected);
}

}  // namespace
