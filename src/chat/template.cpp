#include "chat/template.h"

#include "chat/python_text.h"
#include "core/error.h"

namespace lode::chat {

namespace {

constexpr std::string_view kToolsIntro =
    "# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr std::string_view kToolsFormat =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n- Function calls MUST follow the specified format: an inner <function=...>"
    "</function> block must be nested within <tool_call></tool_call> XML tags\n- Required "
    "parameters MUST be specified\n- You may provide optional reasoning for your function call in "
    "natural language BEFORE the function call, but NOT after\n- If there is no function call "
    "available, answer the question like normal with your current knowledge and do not tell the "
    "user about function calls\n</IMPORTANT>";

// The text being rendered: += appends the template's own text, client() the client's, marked.
class Out {
 public:
  Out& operator+=(std::string_view text) {
    chat_.text += text;
    return *this;
  }
  Out& operator+=(char c) {
    chat_.text += c;
    return *this;
  }
  void client(std::string_view text) {
    if (text.empty()) return;
    const std::size_t begin = chat_.text.size();
    chat_.text += text;
    if (!chat_.client.empty() && chat_.client.back().end == begin) chat_.client.back().end = chat_.text.size();
    else chat_.client.push_back({begin, chat_.text.size()});
  }
  RenderedChat take() { return std::move(chat_); }

 private:
  RenderedChat chat_;
};

// The template's `tools and tools is iterable and tools is not mapping`.
bool has_tools(const nlohmann::ordered_json& tools) { return tools.is_array() && !tools.empty(); }

// Python's str.lstrip(chars) / str.rstrip(chars) for one ASCII character.
std::string_view lstrip_char(std::string_view text, char c) {
  while (!text.empty() && text.front() == c) text.remove_prefix(1);
  return text;
}
std::string_view rstrip_char(std::string_view text, char c) {
  while (!text.empty() && text.back() == c) text.remove_suffix(1);
  return text;
}

// text.split(separator)[0] and text.split(separator)[-1].
std::string_view before_first(std::string_view text, std::string_view separator) {
  return text.substr(0, text.find(separator));
}
std::string_view after_last(std::string_view text, std::string_view separator) {
  const std::size_t at = text.rfind(separator);
  return at == std::string_view::npos ? text : text.substr(at + separator.size());
}

void render_system_header(Out& out, std::span<const Message> messages,
                          const nlohmann::ordered_json& tools) {
  const bool system_first = messages.front().role == "system";
  const std::string_view system = system_first ? python_strip(messages.front().content) : "";
  if (has_tools(tools)) {
    out += "<|im_start|>system\n";
    out += kToolsIntro;
    for (const auto& tool : tools) {
      out += '\n';
      out.client(python_json_dumps(tool));
    }
    out += "\n</tools>";
    out += kToolsFormat;
    if (!system.empty()) {
      out += "\n\n";
      out.client(system);
    }
    out += "<|im_end|>\n";
  } else if (system_first) {
    out += "<|im_start|>system\n";
    out.client(system);
    out += "<|im_end|>\n";
  }
}

// Index of the last user message that is a real query, not tool output the client wrapped in
// <tool_response> tags; assistant turns after it keep their reasoning.
std::size_t last_query_index(std::span<const Message> messages) {
  for (std::size_t i = messages.size(); i-- > 0;) {
    if (messages[i].role != "user") continue;
    const std::string_view content = python_strip(messages[i].content);
    if (!(content.starts_with("<tool_response>") && content.ends_with("</tool_response>"))) {
      return i;
    }
  }
  fail("No user query found in messages.");
}

// Arguments that are objects or arrays are written as JSON, everything else as Python's str().
void render_tool_call(Out& out, const ToolCall& call, bool first, bool after_content) {
  if (first) out += after_content ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=";
  else out += "\n<tool_call>\n<function=";
  out.client(call.name);
  out += ">\n";
  if (call.arguments.is_object()) {
    for (const auto& [name, value] : call.arguments.items()) {
      out += "<parameter=";
      out.client(name);
      out += ">\n";
      out.client(value.is_structured() ? python_json_dumps(value) : python_str(value));
      out += "\n</parameter>\n";
    }
  }
  out += "</function>\n</tool_call>";
}

void render_assistant(Out& out, const Message& message, std::string_view content, bool keep_reasoning,
                      bool open = false) {
  std::string_view reasoning;
  if (message.reasoning_content) {
    reasoning = *message.reasoning_content;
  } else if (content.find("</think>") != std::string_view::npos) {
    // The template's content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n').
    reasoning = lstrip_char(after_last(rstrip_char(before_first(content, "</think>"), '\n'),
                                       "<think>"), '\n');
    content = lstrip_char(after_last(content, "</think>"), '\n');
  }
  reasoning = python_strip(reasoning);
  out += "<|im_start|>assistant\n";
  if (keep_reasoning) {
    out += "<think>\n";
    out.client(reasoning);
    out += "\n</think>\n\n";
  }
  out.client(content);
  if (open) return;  // (a prefill: the model goes on from its content)
  const bool has_content = !python_strip(content).empty();
  for (std::size_t i = 0; i < message.tool_calls.size(); ++i) {
    render_tool_call(out, message.tool_calls[i], i == 0, has_content);
  }
  out += "<|im_end|>\n";
}

// Consecutive tool results share one user turn.
void render_tool_result(Out& out, std::span<const Message> messages, std::size_t index,
                        std::string_view content) {
  if (index > 0 && messages[index - 1].role != "tool") out += "<|im_start|>user";
  out += "\n<tool_response>\n";
  out.client(content);
  out += "\n</tool_response>";
  const bool last = index + 1 == messages.size();
  if (last || messages[index + 1].role != "tool") out += "<|im_end|>\n";
}

std::string content_from_json(const nlohmann::ordered_json& content, std::string_view role) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    fail("chat message ({}): content must be a string, null or a list of text parts, got {}", role,
         content.type_name());
  }
  std::string text;
  for (const auto& part : content) {
    const bool text_part = part.is_object() && part.contains("text") && part["text"].is_string() &&
                           (!part.contains("type") || part["type"] == "text");
    if (!text_part) {
      fail("chat message ({}): every content part must be {{\"type\": \"text\", \"text\": "
           "string}} (images and video are not supported), got {}", role, part.dump());
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// A tool call's arguments: an object, or (the OpenAI wire format) a string holding one.
nlohmann::ordered_json arguments_from_json(const nlohmann::ordered_json& arguments,
                                           std::string_view name) {
  if (arguments.is_null()) return nlohmann::ordered_json::object();
  if (arguments.is_object()) return arguments;
  if (arguments.is_string()) {
    auto parsed = nlohmann::ordered_json::parse(arguments.get<std::string>(), nullptr, false);
    if (parsed.is_object()) return parsed;
    fail("chat message: the arguments of tool call '{}' are a string that is not a JSON object: "
         "{}", name, arguments.get<std::string>());
  }
  fail("chat message: the arguments of tool call '{}' must be an object or a JSON string, got {}",
       name, arguments.type_name());
}

ToolCall tool_call_from_json(const nlohmann::ordered_json& call) {
  if (!call.is_object()) fail("chat message: a tool call must be an object, got {}", call.dump());
  // OpenAI nests name and arguments under "function"; the template also accepts them flat.
  const auto& function = call.contains("function") ? call["function"] : call;
  if (!function.is_object() || !function.contains("name") || !function["name"].is_string()) {
    fail("chat message: a tool call needs function.name (a string), got {}", call.dump());
  }
  ToolCall out;
  out.name = function["name"].get<std::string>();
  if (call.contains("id") && !call["id"].is_null()) {
    if (!call["id"].is_string()) fail("chat message: tool call id must be text: {}", call.dump());
    out.id = call["id"].get<std::string>();
  }
  const auto arguments = function.find("arguments");
  out.arguments = arguments == function.end() ? nlohmann::ordered_json::object()
                                              : arguments_from_json(*arguments, out.name);
  return out;
}

}  // namespace

Message message_from_json(const nlohmann::ordered_json& json) {
  if (!json.is_object()) fail("chat message must be a JSON object, got {}", json.type_name());
  if (!json.contains("role") || !json["role"].is_string()) {
    fail("chat message needs a \"role\" string (system, user, assistant, tool): {}", json.dump());
  }
  Message message;
  message.role = json["role"].get<std::string>();
  if (json.contains("content")) message.content = content_from_json(json["content"], message.role);
  if (json.contains("reasoning_content") && !json["reasoning_content"].is_null()) {
    if (!json["reasoning_content"].is_string()) {
      fail("chat message ({}): reasoning_content must be a string or null, got {}", message.role,
           json["reasoning_content"].type_name());
    }
    message.reasoning_content = json["reasoning_content"].get<std::string>();
  }
  if (json.contains("tool_calls") && !json["tool_calls"].is_null()) {
    if (!json["tool_calls"].is_array()) {
      fail("chat message ({}): tool_calls must be a list, got {}", message.role,
           json["tool_calls"].type_name());
    }
    for (const auto& call : json["tool_calls"]) {
      message.tool_calls.push_back(tool_call_from_json(call));
    }
  }
  return message;
}

std::string render_qwen35(std::span<const Message> messages, const nlohmann::ordered_json& tools,
                          const TemplateOptions& options) {
  return render_qwen35_marked(messages, tools, options).text;
}

RenderedChat render_qwen35_marked(std::span<const Message> messages, const nlohmann::ordered_json& tools,
                                  const TemplateOptions& options) {
  if (messages.empty()) fail("No messages provided.");
  const bool open_last = options.continue_final_message;
  if (open_last && (messages.back().role != "assistant" || !messages.back().tool_calls.empty()))
    fail("Only a last assistant message without tool calls can be continued.");
  Out out;
  render_system_header(out, messages, tools);
  const std::size_t last_query = last_query_index(messages);
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const Message& message = messages[i];
    const std::string_view content = python_strip(message.content);
    if (message.role == "system") {
      if (i != 0) fail("System message must be at the beginning.");
    } else if (message.role == "user") {
      out += "<|im_start|>user\n";
      out.client(content);
      out += "<|im_end|>\n";
    } else if (message.role == "assistant") {
      render_assistant(out, message, content, i > last_query, open_last && i + 1 == messages.size());
    } else if (message.role == "tool") {
      render_tool_result(out, messages, i, content);
    } else {
      fail("Unexpected message role.");
    }
  }
  if (options.add_generation_prompt && !open_last) {
    out += "<|im_start|>assistant\n";
    out += options.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
  }
  return out.take();
}

}  // namespace lode::chat
