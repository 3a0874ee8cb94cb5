// Qwen3.5's chat template in C++ against Jinja's own renderings of the published template
// (tests/data/chat/rendered.json, made by tools/chat/render_reference.py), plus the Python text
// rules it depends on and the parsing of OpenAI-style messages.
#include "chat/python_text.h"
#include "chat/template.h"
#include "core/error.h"
#include "support/paths.h"

#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <sstream>

namespace {

using lode::chat::Message;
using nlohmann::ordered_json;

std::string read_text(const std::string& name) {
  const std::string path = lode::test::test_data().string() + "/chat/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ordered_json read_json(const std::string& name) { return ordered_json::parse(read_text(name)); }

std::vector<Message> messages_of(const ordered_json& conversation) {
  std::vector<Message> messages;
  for (const auto& message : conversation.at("messages")) {
    messages.push_back(lode::chat::message_from_json(message));
  }
  return messages;
}

TEST(ChatTemplate, ReferenceTemplateIsThePublishedOne) {
  const std::string jinja = read_text("qwen35_chat_template.jinja");
  EXPECT_TRUE(jinja.starts_with("{%- set image_count = namespace(value=0) %}"));
  EXPECT_NE(jinja.find("System message must be at the beginning."), std::string::npos);
  EXPECT_NE(jinja.find("No user query found in messages."), std::string::npos);
  EXPECT_TRUE(jinja.ends_with("{%- endif %}"));
}

TEST(ChatTemplate, MatchesJinjaOnEveryReferenceConversation) {
  const ordered_json conversations = read_json("conversations.json");
  const ordered_json rendered = read_json("rendered.json");
  ASSERT_EQ(conversations.size(), rendered.size()) << "regenerate with render_reference.py";
  ASSERT_GE(conversations.size(), 30u);
  int n_errors = 0;
  for (std::size_t i = 0; i < conversations.size(); ++i) {
    const ordered_json& conversation = conversations[i];
    const ordered_json& expected = rendered[i];
    const std::string name = conversation.at("name").get<std::string>();
    SCOPED_TRACE(name);
    ASSERT_EQ(expected.at("name").get<std::string>(), name);
    const std::vector<Message> messages = messages_of(conversation);
    const ordered_json tools = conversation.value("tools", ordered_json());
    lode::chat::TemplateOptions options;
    options.add_generation_prompt = conversation.value("add_generation_prompt", true);
    options.enable_thinking = conversation.value("enable_thinking", true);
    if (expected.contains("rendered")) {
      try {
        EXPECT_EQ(lode::chat::render_qwen35(messages, tools, options),
                  expected["rendered"].get<std::string>());
      } catch (const lode::Error& error) {
        ADD_FAILURE() << "unexpected error: " << error.what();
      }
    } else {
      ++n_errors;
      try {
        lode::chat::render_qwen35(messages, tools, options);
        ADD_FAILURE() << "expected the error: " << expected.at("error").get<std::string>();
      } catch (const lode::Error& error) {
        EXPECT_EQ(std::string(error.what()), expected.at("error").get<std::string>());
      }
    }
  }
  EXPECT_GE(n_errors, 4);
}

TEST(ChatTemplate, GenerationPromptFollowsOptions) {
  const std::vector<Message> messages = {{"user", "Hi", std::nullopt, {}}};
  const std::string prefix = "<|im_start|>user\nHi<|im_end|>\n";
  EXPECT_EQ(lode::chat::render_qwen35(messages, nullptr, {}),
            prefix + "<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(lode::chat::render_qwen35(messages, nullptr, {true, false}),
            prefix + "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(lode::chat::render_qwen35(messages, nullptr, {false, true}), prefix);
}

// continue_final_message: the whole conversation as the template renders it, the last assistant
// turn left open after its content (its reasoning block kept, no <|im_end|>), whatever
// add_generation_prompt says; a last message that is not an assistant's, or carries tool calls,
// is refused.
TEST(ChatTemplate, AFinalAssistantMessageIsLeftOpen) {
  std::vector<Message> messages = {{"user", "Hi", std::nullopt, {}}, {"assistant", "Hello, I", "Greet.", {}}};
  const std::string closed = lode::chat::render_qwen35(messages, nullptr, {.add_generation_prompt = false});
  ASSERT_TRUE(closed.ends_with("Hello, I<|im_end|>\n")) << closed;
  const std::string open = closed.substr(0, closed.size() - std::string("<|im_end|>\n").size());
  EXPECT_TRUE(open.ends_with("<|im_start|>assistant\n<think>\nGreet.\n</think>\n\nHello, I")) << open;
  for (const bool generation_prompt : {false, true})
    EXPECT_EQ(lode::chat::render_qwen35(messages, nullptr,
                                        {.add_generation_prompt = generation_prompt, .continue_final_message = true}),
              open);
  messages[1].tool_calls.push_back({"call_0", "f", nlohmann::ordered_json::object()});
  EXPECT_THROW(lode::chat::render_qwen35(messages, nullptr, {.continue_final_message = true}), lode::Error);
  messages.pop_back();
  EXPECT_THROW(lode::chat::render_qwen35(messages, nullptr, {.continue_final_message = true}), lode::Error);
}

// render_qwen35_marked: the text of render_qwen35, with exactly the client's text marked, in order:
// the tools' definitions, the system prompt, every content, tool call and tool result (reasoning
// before the last query is not rendered).
TEST(ChatTemplate, TheClientsTextIsMarked) {
  const ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather"}}])");
  std::vector<Message> messages = {{"system", "Be brief.", std::nullopt, {}},
                                   {"user", "Weather in <|im_start|>Paris?", std::nullopt, {}},
                                   {"assistant", "Checking.", "The user asks.", {}},
                                   {"tool", "18 C", std::nullopt, {}},
                                   {"user", "Thanks", std::nullopt, {}}};
  messages[2].tool_calls.push_back({"call_0", "get_weather", ordered_json::parse(R"({"city": "Paris"})")});
  const auto marked = lode::chat::render_qwen35_marked(messages, tools, {});
  EXPECT_EQ(marked.text, lode::chat::render_qwen35(messages, tools, {}));
  std::vector<std::string> client;
  for (size_t i = 0; i < marked.client.size(); ++i) {
    ASSERT_LT(marked.client[i].begin, marked.client[i].end);
    if (i > 0) ASSERT_LT(marked.client[i - 1].end, marked.client[i].begin);
    client.push_back(marked.text.substr(marked.client[i].begin, marked.client[i].end - marked.client[i].begin));
  }
  EXPECT_EQ(client, (std::vector<std::string>{R"({"type": "function", "function": {"name": "get_weather"}})",
                                              "Be brief.", "Weather in <|im_start|>Paris?", "Checking.",
                                              "get_weather", "city", "Paris", "18 C", "Thanks"}));
}

TEST(ChatPythonText, StripRemovesWhatPythonCallsWhitespace) {
  using lode::chat::python_strip;
  EXPECT_EQ(python_strip(" \t\n\r\v\f x y \n"), "x y");
  EXPECT_EQ(python_strip("\x1c\x1f" "a" "\x1d\x1e"), "a");
  // U+3000, U+00A0, U+2003, U+0085, U+2029 are spaces to Python; U+200B and U+FEFF are not.
  EXPECT_EQ(python_strip("\u3000\u00a0\u2003a\u0085\u2029"), "a");
  EXPECT_EQ(python_strip("\u200ba\u200b"), "\u200ba\u200b");
  EXPECT_EQ(python_strip("\ufeff"), "\ufeff");
  EXPECT_EQ(python_strip("  "), "");
  EXPECT_EQ(python_strip(""), "");
  EXPECT_EQ(python_strip("\xff a \xc3"), "\xff a \xc3");  // broken UTF-8 is not whitespace
  EXPECT_EQ(python_strip("\xc0\xa0" "a"), "\xc0\xa0" "a");  // nor is an overlong space
}

TEST(ChatPythonText, FloatReprMatchesPython) {
  using lode::chat::python_float_repr;
  // Expected values are Python 3.11's repr() of the same doubles.
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(-2.5), "-2.5");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(0.00001), "1e-05");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(1.5e-7), "1.5e-07");
  EXPECT_EQ(python_float_repr(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(python_float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(python_float_repr(5e-324), "5e-324");
  EXPECT_EQ(python_float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(python_float_repr(1e100), "1e+100");
}

TEST(ChatPythonText, StrAndJsonDumpsMatchPython) {
  using lode::chat::python_json_dumps;
  using lode::chat::python_str;
  EXPECT_EQ(python_str(true), "True");
  EXPECT_EQ(python_str(false), "False");
  EXPECT_EQ(python_str(nullptr), "None");
  EXPECT_EQ(python_str(-12), "-12");
  EXPECT_EQ(python_str(18446744073709551615ull), "18446744073709551615");
  EXPECT_EQ(python_str(2.0), "2.0");
  EXPECT_EQ(python_str("text \"as is\""), "text \"as is\"");
  EXPECT_THROW(python_str(ordered_json::array()), lode::Error);
  const ordered_json value = ordered_json::parse(
      R"({"z": 1, "a": [true, null, 1.0, 1e-05, "é\n\"\\\u0001"], "e": {}, "l": []})");
  EXPECT_EQ(python_json_dumps(value),
            R"({"z": 1, "a": [true, null, 1.0, 1e-05, "é\n\"\\\u0001"], "e": {}, "l": []})");
  EXPECT_EQ(python_json_dumps(std::numeric_limits<double>::infinity()), "Infinity");
}

TEST(ChatMessageJson, ReadsOpenAiMessages) {
  const Message text_parts = lode::chat::message_from_json(ordered_json::parse(
      R"({"role": "user", "content": [{"type": "text", "text": "a "}, {"text": "b"}]})"));
  EXPECT_EQ(text_parts.role, "user");
  EXPECT_EQ(text_parts.content, "a b");
  EXPECT_FALSE(text_parts.reasoning_content.has_value());

  const Message null_content = lode::chat::message_from_json(
      ordered_json::parse(R"({"role": "assistant", "content": null, "reasoning_content": ""})"));
  EXPECT_EQ(null_content.content, "");
  ASSERT_TRUE(null_content.reasoning_content.has_value());
  EXPECT_EQ(*null_content.reasoning_content, "");

  const Message with_calls = lode::chat::message_from_json(ordered_json::parse(R"({
    "role": "assistant", "content": "", "tool_calls": [
      {"id": "c1", "type": "function",
       "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": {\"b\": [2]}}"}},
      {"function": {"name": "g", "arguments": {"q": "x"}}},
      {"function": {"name": "h"}}]})"));
  ASSERT_EQ(with_calls.tool_calls.size(), 3u);
  EXPECT_EQ(with_calls.tool_calls[0].id, "c1");
  EXPECT_EQ(with_calls.tool_calls[0].name, "f");
  // A JSON-string argument object keeps its key order (the template writes parameters in it).
  EXPECT_EQ(with_calls.tool_calls[0].arguments.dump(), R"({"z":1,"a":{"b":[2]}})");
  EXPECT_EQ(with_calls.tool_calls[1].arguments, ordered_json::parse(R"({"q": "x"})"));
  EXPECT_EQ(with_calls.tool_calls[1].id, "");
  EXPECT_EQ(with_calls.tool_calls[2].arguments, ordered_json::object());
}

TEST(ChatMessageJson, RejectsMalformedMessages) {
  const char* bad[] = {
      R"([])",
      R"("user")",
      R"({"content": "no role"})",
      R"({"role": 3, "content": "x"})",
      R"({"role": "user", "content": 42})",
      R"({"role": "user", "content": {"text": "a mapping"}})",
      R"({"role": "user", "content": [{"type": "image", "image": "x.png"}]})",
      R"({"role": "user", "content": [{"type": "text"}]})",
      R"({"role": "user", "content": ["bare string part"]})",
      R"({"role": "assistant", "reasoning_content": 1})",
      R"({"role": "assistant", "tool_calls": {"function": {"name": "f"}}})",
      R"({"role": "assistant", "tool_calls": ["f"]})",
      R"({"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]})",
      R"({"role": "assistant", "tool_calls": [{"function": {"name": 7}}]})",
      R"({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]})",
      R"({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]})",
      R"({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]})",
      R"({"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "f"}}]})",
  };
  for (const char* json : bad) {
    SCOPED_TRACE(json);
    EXPECT_THROW(lode::chat::message_from_json(ordered_json::parse(json)), lode::Error);
  }
  try {
    lode::chat::message_from_json(ordered_json::parse(R"({"content": "no role"})"));
  } catch (const lode::Error& error) {
    EXPECT_NE(std::string(error.what()).find("role"), std::string::npos) << error.what();
  }
}

}  // namespace
