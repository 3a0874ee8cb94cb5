#include "chat/output_parser.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace lode::chat {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";

bool is_layout_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::size_t length_without_trailing_space(std::string_view text) {
  std::size_t length = text.size();
  while (length > 0 && is_layout_space(text[length - 1])) --length;
  return length;
}

std::string_view trim_layout(std::string_view text) {
  text = text.substr(0, length_without_trailing_space(text));
  while (!text.empty() && is_layout_space(text.front())) text.remove_prefix(1);
  return text;
}

// Where the undecided tail of `text` starts: the longest suffix that could still grow into `tag`,
// together with the whitespace before it (layout if the tag completes, text if it does not).
std::size_t undecided_from(std::string_view text, std::string_view tag) {
  std::size_t start = text.size();
  const std::size_t first = text.size() >= tag.size() ? text.size() - tag.size() + 1 : 0;
  for (std::size_t i = first; i < text.size(); ++i) {
    if (tag.starts_with(text.substr(i))) {
      start = i;
      break;
    }
  }
  while (start > 0 && is_layout_space(text[start - 1])) --start;
  return start;
}

// True when `text` (the inside of a <tool_call> so far) ends within a parameter value, where a
// `</tool_call>` is part of the value and does not close the call.
bool inside_parameter_value(std::string_view text) {
  std::size_t pos = 0;
  while (true) {
    const std::size_t open = text.find(kParameterOpen, pos);
    if (open == std::string_view::npos) return false;
    const std::size_t close = text.find(kParameterClose, open);
    if (close == std::string_view::npos) return true;
    pos = close + kParameterClose.size();
  }
}

struct RawCall {
  std::string name;
  std::vector<std::pair<std::string, std::string>> parameters;  // name, value text
};

void skip_layout(std::string_view text, std::size_t& pos) {
  while (pos < text.size() && is_layout_space(text[pos])) ++pos;
}

// Reads `<function=NAME>` or `<parameter=NAME>` at `pos`; nullopt when the text there is not one.
std::optional<std::string> read_open_tag(std::string_view text, std::size_t& pos,
                                         std::string_view prefix) {
  if (!text.substr(pos).starts_with(prefix)) return std::nullopt;
  const std::size_t close = text.find('>', pos + prefix.size());
  if (close == std::string_view::npos) return std::nullopt;
  const std::string_view name = trim_layout(text.substr(pos + prefix.size(),
                                                        close - pos - prefix.size()));
  if (name.empty()) return std::nullopt;
  pos = close + 1;
  return std::string(name);
}

// The template writes a value between one newline after the opening tag and one before the
// closing tag; any other newlines belong to the value.
std::string_view strip_value_layout(std::string_view value) {
  if (value.starts_with('\n')) value.remove_prefix(1);
  if (value.ends_with('\n')) value.remove_suffix(1);
  return value;
}

// The calls between <tool_call> and </tool_call>; nullopt when the text is not well formed.
std::optional<std::vector<RawCall>> parse_call_block(std::string_view block) {
  std::vector<RawCall> calls;
  std::size_t pos = 0;
  while (skip_layout(block, pos), pos < block.size()) {
    auto name = read_open_tag(block, pos, kFunctionOpen);
    if (!name) return std::nullopt;
    RawCall call{std::move(*name), {}};
    // A missing </function> right before </tool_call> is tolerated.
    while (skip_layout(block, pos), pos < block.size()) {
      if (block.substr(pos).starts_with(kFunctionClose)) {
        pos += kFunctionClose.size();
        break;
      }
      auto parameter = read_open_tag(block, pos, kParameterOpen);
      if (!parameter) return std::nullopt;
      const std::size_t close = block.find(kParameterClose, pos);
      if (close == std::string_view::npos) return std::nullopt;
      call.parameters.emplace_back(std::move(*parameter),
                                   std::string(strip_value_layout(block.substr(pos, close - pos))));
      pos = close + kParameterClose.size();
    }
    calls.push_back(std::move(call));
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

// JSON text, or one of the Python literals the template writes for booleans and null.
std::optional<nlohmann::ordered_json> parse_value(std::string_view text) {
  const std::string_view trimmed = trim_layout(text);
  if (trimmed == "True") return true;
  if (trimmed == "False") return false;
  if (trimmed == "None") return nullptr;
  auto parsed = nlohmann::ordered_json::parse(trimmed, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return std::nullopt;
  return parsed;
}

bool has_schema_type(const nlohmann::ordered_json& value, std::string_view type) {
  if (type == "integer") return value.is_number_integer();
  if (type == "number") return value.is_number();
  if (type == "boolean") return value.is_boolean();
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "null") return value.is_null();
  return false;
}

nlohmann::ordered_json convert_value(const std::string& text,
                                     const std::vector<std::string>& types) {
  const auto is_string = [](const std::string& type) { return type == "string"; };
  if (!types.empty() && std::all_of(types.begin(), types.end(), is_string)) return text;
  const auto parsed = parse_value(text);
  if (parsed && std::any_of(types.begin(), types.end(), [&](const std::string& type) {
        return has_schema_type(*parsed, type);
      })) {
    return *parsed;
  }
  if (std::any_of(types.begin(), types.end(), is_string)) return text;
  if (parsed) return *parsed;
  return text;
}

const nlohmann::ordered_json* find_object(const nlohmann::ordered_json& json, const char* key) {
  if (!json.is_object()) return nullptr;
  const auto it = json.find(key);
  return it != json.end() && it->is_object() ? &*it : nullptr;
}

std::vector<std::string> schema_types(const nlohmann::ordered_json& schema) {
  std::vector<std::string> types;
  const auto type = schema.is_object() ? schema.find("type") : schema.end();
  if (type == schema.end()) return types;
  if (type->is_string()) types.push_back(type->get<std::string>());
  if (type->is_array()) {
    for (const auto& item : *type) {
      if (item.is_string()) types.push_back(item.get<std::string>());
    }
  }
  return types;
}

}  // namespace

OutputParser::OutputParser(bool thinking_open, nlohmann::ordered_json tools)
    : thinking_open_(thinking_open) {
  if (!tools.is_array()) return;
  for (const auto& tool : tools) {
    // OpenAI nests the definition under "function"; a bare definition works too.
    const auto* function = find_object(tool, "function");
    if (!function) function = &tool;
    if (!function->is_object() || !function->contains("name") ||
        !(*function)["name"].is_string()) {
      continue;
    }
    auto& types = parameter_types_[(*function)["name"].get<std::string>()];
    const auto* parameters = find_object(*function, "parameters");
    const auto* properties = parameters ? find_object(*parameters, "properties") : nullptr;
    if (!properties) continue;
    for (const auto& [name, schema] : properties->items()) types[name] = schema_types(schema);
  }
}

ParsedDelta OutputParser::push(std::string_view text) {
  pending_ += text;
  ParsedDelta out;
  while (step(out)) {
  }
  return out;
}

ParsedDelta OutputParser::finish() {
  ParsedDelta out;
  while (step(out)) {
  }
  switch (mode_) {
    case Mode::start: (thinking_open_ ? out.reasoning : out.content) += pending_; break;
    case Mode::reasoning: out.reasoning += pending_; break;
    case Mode::content: out.content += pending_; break;
    case Mode::tool_call:
      out.content += layout_before_call_ + std::string(kCallOpen) + pending_;
      break;
  }
  pending_.clear();
  return out;
}

bool OutputParser::step(ParsedDelta& out) {
  switch (mode_) {
    case Mode::start: return step_start();
    case Mode::reasoning: return step_reasoning(out);
    case Mode::content: return step_content(out);
    case Mode::tool_call: return step_tool_call(out);
  }
  return false;
}

// A model may open its own <think> block even where the prompt did not.
bool OutputParser::step_start() {
  if (pending_.starts_with(kThinkOpen)) {
    pending_.erase(0, kThinkOpen.size());
    mode_ = Mode::reasoning;
    drop_newlines_ = true;
    return true;
  }
  if (kThinkOpen.starts_with(pending_)) return false;
  mode_ = thinking_open_ ? Mode::reasoning : Mode::content;
  return true;
}

void OutputParser::drop_layout_newlines() {
  if (!drop_newlines_) return;
  const std::size_t text_at = pending_.find_first_not_of('\n');
  pending_.erase(0, text_at);
  if (text_at != std::string::npos) drop_newlines_ = false;
}

bool OutputParser::step_reasoning(ParsedDelta& out) {
  drop_layout_newlines();
  const std::size_t end = pending_.find(kThinkClose);
  if (end != std::string::npos) {
    out.reasoning.append(pending_, 0, length_without_trailing_space(pending_.substr(0, end)));
    pending_.erase(0, end + kThinkClose.size());
    mode_ = Mode::content;
    drop_newlines_ = true;
    return true;
  }
  const std::size_t undecided = undecided_from(pending_, kThinkClose);
  out.reasoning.append(pending_, 0, undecided);
  pending_.erase(0, undecided);
  return false;
}

bool OutputParser::step_content(ParsedDelta& out) {
  drop_layout_newlines();
  const std::size_t start = pending_.find(kCallOpen);
  if (start != std::string::npos) {
    const std::size_t text_end = length_without_trailing_space(pending_.substr(0, start));
    out.content.append(pending_, 0, text_end);
    layout_before_call_ = pending_.substr(text_end, start - text_end);
    pending_.erase(0, start + kCallOpen.size());
    mode_ = Mode::tool_call;
    call_end_search_ = 0;
    return true;
  }
  const std::size_t undecided = undecided_from(pending_, kCallOpen);
  out.content.append(pending_, 0, undecided);
  pending_.erase(0, undecided);
  return false;
}

bool OutputParser::step_tool_call(ParsedDelta& out) {
  std::size_t from = call_end_search_;
  while (true) {
    const std::size_t end = pending_.find(kCallClose, from);
    if (end == std::string::npos) {
      // The next search starts where a closing tag split across pushes could begin.
      const std::size_t tail = pending_.size() >= kCallClose.size()
                                   ? pending_.size() - kCallClose.size() + 1 : 0;
      call_end_search_ = std::max(from, tail);
      return false;
    }
    if (inside_parameter_value(std::string_view(pending_).substr(0, end))) {
      from = end + 1;
      continue;
    }
    drop_newlines_ = emit_call_block(std::string_view(pending_).substr(0, end), out);
    pending_.erase(0, end + kCallClose.size());
    mode_ = Mode::content;
    return true;
  }
}

bool OutputParser::emit_call_block(std::string_view block, ParsedDelta& out) {
  const auto calls = parse_call_block(block);
  if (!calls) {
    // Not a call after all: give the text back as it came, layout included.
    out.content += layout_before_call_ + std::string(kCallOpen) + std::string(block) +
                   std::string(kCallClose);
    return false;
  }
  for (const RawCall& raw : *calls) {
    ToolCall call;
    call.id = "call_" + std::to_string(next_call_id_++);
    call.name = raw.name;
    call.arguments = nlohmann::ordered_json::object();
    const auto tool = parameter_types_.find(raw.name);
    for (const auto& [name, text] : raw.parameters) {
      static const std::vector<std::string> kUnknown;
      const std::vector<std::string>* types = &kUnknown;
      if (tool != parameter_types_.end()) {
        const auto parameter = tool->second.find(name);
        if (parameter != tool->second.end()) types = &parameter->second;
      }
      call.arguments[name] = convert_value(text, *types);
    }
    out.tool_calls.push_back(std::move(call));
  }
  return true;
}

}  // namespace lode::chat
