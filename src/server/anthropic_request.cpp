#include "server/anthropic_request.h"

#include <fmt/format.h>

#include <limits>

#include "server/api_error.h"
#include "server/json_fields.h"

namespace lode::server {
namespace {

using json = nlohmann::ordered_json;

std::string block_type(const json& block, const std::string& where) {
  const json* type = block.is_object() ? field(block, "type") : nullptr;
  if (!type || !type->is_string())
    throw bad_request(fmt::format("{} must be an object with a string \"type\", got {}", where, block.dump()));
  return type->get<std::string>();
}

std::string string_in(const json& block, const char* name, const std::string& where) {
  const json* v = field(block, name);
  if (!v || !v->is_string()) throw bad_request(fmt::format("{}.{} must be a string", where, name));
  return v->get<std::string>();
}

// A string, or a list of {type: "text", text} blocks joined (system prompts, tool results).
std::string text_of(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    throw bad_request(fmt::format("{} must be a string or a list of text blocks, got {}", where, content.type_name()));
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    if (block_type(content[i], at) != "text")
      throw bad_request(fmt::format("{}: only text blocks are supported here, got \"{}\"", at, content[i]["type"].get<std::string>()));
    text += string_in(content[i], "text", at);
  }
  return text;
}

chat::ToolCall tool_use(const json& block, const std::string& where) {
  chat::ToolCall call;
  call.id = string_in(block, "id", where);
  call.name = string_in(block, "name", where);
  const json* input = field(block, "input");
  if (!input || !input->is_object()) throw bad_request(fmt::format("{}.input must be an object", where));
  call.arguments = *input;
  return call;
}

// One Anthropic message as one or more chat messages (tool results become "tool" messages).
void add_message(const json& m, const std::string& where, std::vector<chat::Message>& out) {
  if (!m.is_object()) throw bad_request(fmt::format("{} must be an object {{role, content}}, got {}", where, m.dump()));
  const json* role = field(m, "role");
  if (!role || !role->is_string() || (*role != "user" && *role != "assistant"))
    throw bad_request(fmt::format("{}.role must be \"user\" or \"assistant\", got {}", where, role ? role->dump() : "nothing"));
  const json* content = field(m, "content");
  if (!content) throw bad_request(fmt::format("{}.content is required", where));
  chat::Message message;
  message.role = role->get<std::string>();
  if (content->is_string()) {
    message.content = content->get<std::string>();
    out.push_back(std::move(message));
    return;
  }
  if (!content->is_array())
    throw bad_request(fmt::format("{}.content must be a string or a list of content blocks, got {}", where, content->type_name()));
  if (content->empty() && message.role == "user")
    throw bad_request(fmt::format("{}.content must not be empty: give a text block or a tool_result", where));
  bool any_text = false;
  for (size_t i = 0; i < content->size(); ++i) {
    const json& block = (*content)[i];
    const std::string at = fmt::format("{}.content[{}]", where, i);
    const std::string type = block_type(block, at);
    const bool user = message.role == "user";
    if (type == "text") {
      message.content += string_in(block, "text", at);
      any_text = true;
    } else if (type == "thinking" && !user) {
      message.reasoning_content = message.reasoning_content.value_or("") + string_in(block, "thinking", at);
    } else if (type == "redacted_thinking" && !user) {
      // Opaque to us: nothing to render.
    } else if (type == "tool_use" && !user) {
      message.tool_calls.push_back(tool_use(block, at));
    } else if (type == "tool_result" && user) {
      string_in(block, "tool_use_id", at);
      const json* result = field(block, "content");
      out.push_back({.role = "tool", .content = result ? text_of(*result, at + ".content") : ""});
    } else {
      throw bad_request(fmt::format("{}: a {} message cannot hold a \"{}\" block (supported: text, and {})", at,
                                    message.role, type, user ? "tool_result" : "thinking, tool_use"));
    }
  }
  // A user turn that only carried tool results has no text of its own to show.
  if (message.role == "assistant" || any_text) out.push_back(std::move(message));
}

std::vector<chat::Message> messages(const json& body) {
  std::vector<chat::Message> out;
  if (const json* system = field(body, "system")) out.push_back({.role = "system", .content = text_of(*system, "system")});
  const json* v = field(body, "messages");
  if (!v) throw bad_request("messages is required: a list of {role, content} objects", "messages");
  if (!v->is_array()) throw bad_request(fmt::format("messages must be a list, got {}", v->type_name()), "messages");
  if (v->empty()) throw bad_request("messages must not be empty", "messages");
  for (size_t i = 0; i < v->size(); ++i) add_message((*v)[i], fmt::format("messages[{}]", i), out);
  return out;
}

// Anthropic tool definitions as the OpenAI-style ones the template renders; null when none.
json tool_definitions(const json& body) {
  const json* v = field(body, "tools");
  if (!v) return nullptr;
  if (!v->is_array()) throw bad_request(fmt::format("tools must be a list, got {}", v->type_name()), "tools");
  json out = json::array();
  for (size_t i = 0; i < v->size(); ++i) {
    const json& tool = (*v)[i];
    const std::string at = fmt::format("tools[{}]", i);
    const json* name = tool.is_object() ? field(tool, "name") : nullptr;
    const json* schema = tool.is_object() ? field(tool, "input_schema") : nullptr;
    if (!name || !name->is_string() || name->get<std::string>().empty() || !schema || !schema->is_object())
      throw bad_request(fmt::format("{} must be {{\"name\": ..., \"description\": ..., \"input_schema\": {{...}}}}", at), at);
    json function = {{"name", *name}};
    if (const json* d = field(tool, "description")) {
      if (!d->is_string()) throw bad_request(fmt::format("{}.description must be a string", at), at);
      function["description"] = *d;
    }
    function["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  if (out.empty()) return nullptr;
  return out;
}

// The tool definitions shown to the model (null when none are), and the names a forcing
// tool_choice ("any", or "tool" with a name) allows.
std::pair<json, std::vector<std::string>> tools(const json& body) {
  const json shown = tool_definitions(body);
  const json* c = field(body, "tool_choice");
  if (!c) return {shown, {}};
  const std::string type = block_type(*c, "tool_choice");
  if (type == "auto") return {shown, {}};
  if (type == "none") return {nullptr, {}};
  if (type == "any") return {shown, forced_tool_names(shown, "", "tool_choice")};
  if (type != "tool")
    throw bad_request(fmt::format("tool_choice.type \"{}\" is not one of auto, any, tool, none", type), "tool_choice");
  const json* name = field(*c, "name");
  if (!name || !name->is_string() || name->get<std::string>().empty())
    throw bad_request("tool_choice {\"type\": \"tool\"} needs the tool's \"name\"", "tool_choice.name");
  return {shown, forced_tool_names(shown, name->get<std::string>(), "tool_choice.name")};
}

bool thinking(const json& body) {
  const json* t = field(body, "thinking");
  if (!t) return false;  // Anthropic's default: no extended thinking
  const std::string type = block_type(*t, "thinking");
  if (type == "disabled") return false;
  if (type != "enabled") throw bad_request(fmt::format("thinking.type \"{}\" is not \"enabled\" or \"disabled\"", type), "thinking");
  // Required, as by Anthropic; not enforced yet (the model thinks until it closes </think>).
  if (!integer_in(*t, "budget_tokens", 1, std::numeric_limits<int32_t>::max()))
    throw bad_request("thinking.budget_tokens is required when thinking is enabled (an integer >= 1)", "thinking.budget_tokens");
  return true;
}

GenerationRequest generation(const json& body, uint64_t random_seed) {
  GenerationRequest r;
  r.max_tokens = integer_in(body, "max_tokens", 1, std::numeric_limits<int32_t>::max());
  if (!r.max_tokens) throw bad_request("max_tokens is required: the most tokens to generate", "max_tokens");
  if (auto t = number_in(body, "temperature", 0, 1)) r.sampling.temperature = float(*t);
  if (auto p = number_in(body, "top_p", 0, 1)) r.sampling.top_p = float(*p);
  if (auto k = integer_in(body, "top_k", 0, std::numeric_limits<int32_t>::max())) r.sampling.top_k = int(*k);
  r.sampling.seed = random_seed;
  if (const json* stops = field(body, "stop_sequences")) {
    if (!stops->is_array()) throw bad_request("stop_sequences must be a list of strings", "stop_sequences");
    for (const json& s : *stops) {
      if (!s.is_string() || s.get<std::string>().empty())
        throw bad_request(fmt::format("stop_sequences must hold non-empty strings, got {}", s.dump()), "stop_sequences");
      r.stop.push_back(s.get<std::string>());
    }
  }
  r.stream = boolean(body, "stream", "stream").value_or(false);
  return r;
}

}  // namespace

ChatRequest parse_count_tokens_request(const json& body, const ModelNames& names) {
  ChatRequest r;
  r.generation.model = check_model(body, names);
  r.messages = messages(body);
  std::tie(r.tools, r.forced_tools) = tools(body);
  r.enable_thinking = thinking(body);
  return r;
}

ChatRequest parse_messages_request(const json& body, const ModelNames& names, uint64_t random_seed) {
  const std::string model = check_model(body, names);
  ChatRequest r;
  r.generation = generation(body, random_seed);
  r.generation.model = model;
  r.messages = messages(body);
  std::tie(r.tools, r.forced_tools) = tools(body);
  r.enable_thinking = thinking(body);
  return r;
}

}  // namespace lode::server
