#include "server/openai_response.h"

#include "server/wire_json.h"

namespace lode::server {
namespace {

using json = nlohmann::ordered_json;

json tool_call_json(const chat::ToolCall& call) {
  return {{"id", call.id}, {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", wire_json(call.arguments)}}}};
}

json reason_or_null(const char* finish_reason) {
  return finish_reason ? json(finish_reason) : json(nullptr);
}

}  // namespace

const char* finish_reason(engine::FinishReason finish, bool has_tool_calls) {
  if (has_tool_calls) return "tool_calls";
  // Ended by the model, a stop string or a cancel: "stop"; by a limit (max_tokens, the context): "length".
  using engine::FinishReason;
  const bool stopped = finish == FinishReason::end_of_generation || finish == FinishReason::stop_string ||
                       finish == FinishReason::cancelled;
  return stopped ? "stop" : "length";
}

json usage_json(const engine::GenerateResult& r) {
  const int64_t completion = int64_t(r.tokens.size());
  return {{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", completion},
          {"total_tokens", r.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
}

json chat_completion(const ResponseMeta& meta, const chat::ParsedDelta& reply, const engine::GenerateResult& result) {
  json message = {{"role", "assistant"}};
  const bool calls = !reply.tool_calls.empty();
  message["content"] = reply.content.empty() && calls ? json(nullptr) : json(reply.content);
  if (!reply.reasoning.empty()) message["reasoning_content"] = reply.reasoning;
  if (calls) {
    json list = json::array();
    for (const auto& call : reply.tool_calls) list.push_back(tool_call_json(call));
    message["tool_calls"] = std::move(list);
  }
  return {{"id", meta.id}, {"object", "chat.completion"}, {"created", meta.created}, {"model", meta.model},
          {"choices", json::array({{{"index", 0}, {"message", std::move(message)}, {"logprobs", nullptr},
                                    {"finish_reason", finish_reason(result.finish, calls)}}})},
          {"usage", usage_json(result)}};
}

json chat_chunk(const ResponseMeta& meta, json delta, const char* finish) {
  return {{"id", meta.id}, {"object", "chat.completion.chunk"}, {"created", meta.created}, {"model", meta.model},
          {"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr},
                                    {"finish_reason", reason_or_null(finish)}}})}};
}

std::vector<json> chat_delta_chunks(const ResponseMeta& meta, const chat::ParsedDelta& d, int& next_tool_index) {
  std::vector<json> out;
  if (!d.reasoning.empty()) out.push_back(chat_chunk(meta, {{"reasoning_content", d.reasoning}}));
  if (!d.content.empty()) out.push_back(chat_chunk(meta, {{"content", d.content}}));
  for (const auto& call : d.tool_calls) {
    json entry = tool_call_json(call);
    entry = json{{"index", next_tool_index++}, {"id", entry["id"]}, {"type", "function"}, {"function", entry["function"]}};
    out.push_back(chat_chunk(meta, {{"tool_calls", json::array({std::move(entry)})}}));
  }
  return out;
}

json usage_chunk(const ResponseMeta& meta, const engine::GenerateResult& result, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model},
          {"choices", json::array()}, {"usage", usage_json(result)}};
}

json text_completion(const ResponseMeta& meta, const std::string& text, const engine::GenerateResult& result) {
  return {{"id", meta.id}, {"object", "text_completion"}, {"created", meta.created}, {"model", meta.model},
          {"choices", json::array({{{"text", text}, {"index", 0}, {"logprobs", nullptr},
                                    {"finish_reason", finish_reason(result.finish, false)}}})},
          {"usage", usage_json(result)}};
}

json text_completion_chunk(const ResponseMeta& meta, const std::string& text, const char* finish) {
  return {{"id", meta.id}, {"object", "text_completion"}, {"created", meta.created}, {"model", meta.model},
          {"choices", json::array({{{"text", text}, {"index", 0}, {"logprobs", nullptr},
                                    {"finish_reason", reason_or_null(finish)}}})}};
}

std::string sse_event(const json& data) {
  // dump() escapes newlines inside strings, so one event is one line.
  return "data: " + wire_json(data) + "\n\n";
}

}  // namespace lode::server
