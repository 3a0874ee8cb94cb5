// Qwen3.5's chat template, written out in C++: turns a conversation into the prompt text the model
// was trained on. It reproduces the published Jinja template (tests/data/chat/
// qwen35_chat_template.jinja) byte for byte, as Hugging Face transformers renders it; the test
// compares against renderings made by Jinja itself (tools/chat/render_reference.py).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/text_span.h"

namespace lode::chat {

// The control token that opens every turn the template renders (then the role, a newline).
inline constexpr std::string_view kTurnStart = "<|im_start|>";

struct ToolCall {
  std::string id;
  std::string name;
  nlohmann::ordered_json arguments;  // an object: parameter name -> value, in the order given
};

struct Message {
  std::string role;                              // system, user, assistant, tool
  std::string content;
  std::optional<std::string> reasoning_content = {};  // assistant only
  std::vector<ToolCall> tool_calls = {};              // assistant only
};

struct TemplateOptions {
  bool add_generation_prompt = true;  // end with the opening of the assistant's turn
  bool enable_thinking = true;        // false: the generation prompt closes the <think> block
  // The last message is an assistant's reply already begun (a prefill): its turn is left open after
  // its content for the model to go on, as Hugging Face's continue_final_message renders it. It must
  // be an assistant message without tool calls; add_generation_prompt is then ignored.
  bool continue_final_message = false;
};

// The rendered conversation, and which of its bytes came from the client rather than from the
// template: message contents, reasoning, tool calls and results, the tools' definitions. A
// tokenizer reads control tokens (<|im_start|>...) only outside them, so a message cannot write
// role markers (tokenizer::Tokenizer::encode's `plain`), as OpenAI's API reads such text.
struct RenderedChat {
  std::string text;
  std::vector<TextSpan> client;  // in order, not overlapping
};

// Renders like Qwen3.5's Jinja template; `tools` is a JSON array of tool definitions or null.
// Throws lode::Error with the template's own message where the template raises one
// ("No messages provided.", "No user query found in messages.", "System message must be at the
// beginning.", "Unexpected message role.").
std::string render_qwen35(std::span<const Message> messages, const nlohmann::ordered_json& tools,
                          const TemplateOptions& options);
// The same text, with the client's spans marked.
RenderedChat render_qwen35_marked(std::span<const Message> messages, const nlohmann::ordered_json& tools,
                                  const TemplateOptions& options);

// Parses one OpenAI-style message: {role, content (string | null | [{type: "text", text}]),
// reasoning_content?, tool_calls?: [{id?, type?, function: {name, arguments}}]} where arguments is
// an object or a JSON string holding one. Throws lode::Error saying what is wrong otherwise.
Message message_from_json(const nlohmann::ordered_json& message);

}  // namespace lode::chat
