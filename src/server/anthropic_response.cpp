#include "server/anthropic_response.h"

#include "server/wire_json.h"

namespace lode::server {
namespace {

using json = nlohmann::ordered_json;

json optional_string(const std::optional<std::string>& s) { return s ? json(*s) : json(nullptr); }

}  // namespace

const char* stop_reason(engine::FinishReason finish, bool has_tool_use) {
  using engine::FinishReason;
  switch (finish) {  // (a limit is max_tokens, tool use or not: a call may be cut short)
    case FinishReason::end_of_generation:
    case FinishReason::cancelled: return has_tool_use ? "tool_use" : "end_turn";
    case FinishReason::stop_string: return has_tool_use ? "tool_use" : "stop_sequence";
    case FinishReason::length:
    case FinishReason::context_full: return "max_tokens";
  }
  return has_tool_use ? "tool_use" : "end_turn";
}

std::optional<std::string> matched_stop_sequence(const engine::GenerateResult& result,
                                                 const tokenizer::Tokenizer& tokenizer,
                                                 std::span<const std::string> stop) {
  if (result.finish != engine::FinishReason::stop_string || stop.empty()) return std::nullopt;
  // Generation stops at the first place any stop string completes, so the one that matched is the
  // one whose first occurrence ends earliest.
  const std::string text = tokenizer.decode(result.tokens, /*render_special=*/false);
  std::optional<std::string> best;
  size_t best_end = std::string::npos;
  for (const std::string& s : stop) {
    const size_t at = text.find(s);
    if (at != std::string::npos && at + s.size() < best_end) {
      best_end = at + s.size();
      best = s;
    }
  }
  return best;
}

std::string tool_use_id(const std::string& message_id, int index) {
  const size_t underscore = message_id.find('_');
  const std::string random = underscore == std::string::npos ? message_id : message_id.substr(underscore + 1);
  return "toolu_" + random + "_" + std::to_string(index);
}

json tool_use_block(const chat::ToolCall& call, const std::string& id) {
  return {{"type", "tool_use"}, {"id", id}, {"name", call.name},
          {"input", call.arguments.is_object() ? call.arguments : json::object()}};
}

// As Anthropic counts them: input_tokens the prompt's tokens that were not read from the prefix
// cache, cache_read_input_tokens those that were (the prompt is their sum); nothing is written to a
// cache on request, so cache_creation_input_tokens is 0.
json anthropic_usage(int64_t prompt_tokens, int64_t output_tokens, int64_t cached_tokens) {
  return {{"input_tokens", prompt_tokens - cached_tokens}, {"output_tokens", output_tokens},
          {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", cached_tokens}};
}

json anthropic_message(const ResponseMeta& meta, const chat::ParsedDelta& reply, const engine::GenerateResult& result,
                       const std::optional<std::string>& stop_sequence) {
  json content = json::array();
  if (!reply.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", reply.reasoning}, {"signature", ""}});
  if (!reply.content.empty()) content.push_back({{"type", "text"}, {"text", reply.content}});
  for (size_t i = 0; i < reply.tool_calls.size(); ++i)
    content.push_back(tool_use_block(reply.tool_calls[i], tool_use_id(meta.id, int(i))));
  return {{"id", meta.id}, {"type", "message"}, {"role", "assistant"}, {"model", meta.model},
          {"content", std::move(content)},
          {"stop_reason", stop_reason(result.finish, !reply.tool_calls.empty())},
          {"stop_sequence", optional_string(stop_sequence)},
          {"usage", anthropic_usage(result.prompt_tokens, int64_t(result.tokens.size()), result.cached_tokens)}};
}

json message_start_event(const ResponseMeta& meta, int64_t input_tokens) {
  return {{"type", "message_start"},
          {"message", {{"id", meta.id}, {"type", "message"}, {"role", "assistant"}, {"model", meta.model},
                       {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                       {"usage", anthropic_usage(input_tokens, 0, 0)}}}};
}

json message_delta_event(const char* reason, const std::optional<std::string>& stop_sequence,
                         const engine::GenerateResult& result) {
  return {{"type", "message_delta"},
          {"delta", {{"stop_reason", reason}, {"stop_sequence", optional_string(stop_sequence)}}},
          {"usage", anthropic_usage(result.prompt_tokens, int64_t(result.tokens.size()), result.cached_tokens)}};
}

std::string anthropic_sse(const json& data) {
  return "event: " + data.value("type", std::string("message")) + "\ndata: " + wire_json(data) + "\n\n";
}

}  // namespace lode::server
