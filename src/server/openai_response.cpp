#include "server/openai_response.h"

#include <fmt/format.h>

#include <cmath>

#include "core/utf8.h"
#include "server/wire_json.h"

namespace lode::server {
namespace {

using json = nlohmann::ordered_json;

// A tool call's id: "call_", the reply id's random part and the call's place in the reply, unique
// across a conversation's replies (every reply's first call was "call_0": clients that match tool
// results by id across turns could mix them up).
std::string tool_call_id(const std::string& reply_id, int index) {
  const size_t dash = reply_id.find('-');
  return "call_" + (dash == std::string::npos ? reply_id : reply_id.substr(dash + 1)) + "_" + std::to_string(index);
}

json tool_call_json(const chat::ToolCall& call, const std::string& id) {
  return {{"id", id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", wire_json(call.arguments)}}}};
}

json reason_or_null(const char* finish_reason) {
  return finish_reason ? json(finish_reason) : json(nullptr);
}

std::string token_text(const tokenizer::Tokenizer& tokenizer, int32_t id) {
  return tokenizer.decode(std::span(&id, 1), /*render_special=*/true);
}

// JSON has no infinities: OpenAI sends -9999.0 for a token the model rules out.
double wire_logprob(float logprob) { return std::isfinite(logprob) ? double(logprob) : -9999.0; }

json token_entry(const tokenizer::Tokenizer& tokenizer, int32_t id, float logprob) {
  const std::string text = token_text(tokenizer, id);
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(int(c));
  return {{"token", text}, {"logprob", wire_logprob(logprob)}, {"bytes", std::move(bytes)}};
}

// A token of the legacy completions form as OpenAI writes it: its text as the reply shows it
// (control tokens show none), or "bytes:\xNN..." where that is not whole UTF-8 characters, so two
// such tokens stay two keys of top_logprobs instead of both becoming U+FFFD.
std::string legacy_token(const tokenizer::Tokenizer& tokenizer, int32_t id) {
  const std::string text = tokenizer.decode(std::span(&id, 1), /*render_special=*/false);
  for (size_t at = 0; at < text.size();) {
    const size_t n = utf8::valid_sequence_length(text, at);
    if (n == 0) {
      std::string bytes = "bytes:";
      for (unsigned char c : text) bytes += fmt::format("\\x{:02x}", c);
      return bytes;
    }
    at += n;
  }
  return text;
}

// Characters in text, counting a byte that cannot start one (a piece of a character cut between
// tokens) as none.
int64_t characters(std::string_view text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

json chat_logprobs(std::span<const sample::TokenLogprobs> entries, const tokenizer::Tokenizer& tokenizer) {
  json content = json::array();
  for (const sample::TokenLogprobs& e : entries) {
    json entry = token_entry(tokenizer, e.token, e.logprob);
    json top = json::array();
    for (const auto& [id, logprob] : e.top) top.push_back(token_entry(tokenizer, id, logprob));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json completion_logprobs(std::span<const sample::TokenLogprobs> entries, const tokenizer::Tokenizer& tokenizer,
                         int64_t& offset) {
  json tokens = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  for (const sample::TokenLogprobs& e : entries) {
    const std::string token = legacy_token(tokenizer, e.token);
    tokens.push_back(token);
    logprobs.push_back(wire_logprob(e.logprob));
    json top = json::object();
    for (const auto& [id, logprob] : e.top) top[legacy_token(tokenizer, id)] = wire_logprob(logprob);
    top[token] = wire_logprob(e.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += characters(tokenizer.decode(std::span(&e.token, 1), /*render_special=*/false));
  }
  return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(logprobs)}, {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

const char* finish_reason(engine::FinishReason finish, bool has_tool_calls) {
  // Ended by a limit (max_tokens, the context): "length", calls or not (a call or the text after it
  // may be cut short); by the model, a stop string or a cancel: "tool_calls" when it called, else "stop".
  using engine::FinishReason;
  if (finish == FinishReason::length || finish == FinishReason::context_full) return "length";
  return has_tool_calls ? "tool_calls" : "stop";
}

json usage_json(const engine::GenerateResult& r) {
  const int64_t completion = int64_t(r.tokens.size());
  return {{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", completion},
          {"total_tokens", r.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
}

json chat_completion(const ResponseMeta& meta, const chat::ParsedDelta& reply, const engine::GenerateResult& result,
                     json logprobs) {
  json message = {{"role", "assistant"}};
  const bool calls = !reply.tool_calls.empty();
  message["content"] = reply.content.empty() && calls ? json(nullptr) : json(reply.content);
  if (!reply.reasoning.empty()) message["reasoning_content"] = reply.reasoning;
  if (calls) {
    json list = json::array();
    for (size_t i = 0; i < reply.tool_calls.size(); ++i)
      list.push_back(tool_call_json(reply.tool_calls[i], tool_call_id(meta.id, int(i))));
    message["tool_calls"] = std::move(list);
  }
  return {{"id", meta.id}, {"object", "chat.completion"}, {"created", meta.created}, {"model", meta.model},
          {"choices", json::array({{{"index", 0}, {"message", std::move(message)}, {"logprobs", std::move(logprobs)},
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
    json entry = tool_call_json(call, tool_call_id(meta.id, next_tool_index));
    entry = json{{"index", next_tool_index++}, {"id", entry["id"]}, {"type", "function"}, {"function", entry["function"]}};
    out.push_back(chat_chunk(meta, {{"tool_calls", json::array({std::move(entry)})}}));
  }
  return out;
}

json usage_chunk(const ResponseMeta& meta, const engine::GenerateResult& result, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model},
          {"choices", json::array()}, {"usage", usage_json(result)}};
}

json text_completion(const ResponseMeta& meta, const std::string& text, const engine::GenerateResult& result,
                     json logprobs) {
  return {{"id", meta.id}, {"object", "text_completion"}, {"created", meta.created}, {"model", meta.model},
          {"choices", json::array({{{"text", text}, {"index", 0}, {"logprobs", std::move(logprobs)},
                                    {"finish_reason", finish_reason(result.finish, false)}}})},
          {"usage", usage_json(result)}};
}

json text_completion_chunk(const ResponseMeta& meta, const std::string& text, const char* finish, json logprobs) {
  return {{"id", meta.id}, {"object", "text_completion"}, {"created", meta.created}, {"model", meta.model},
          {"choices", json::array({{{"text", text}, {"index", 0}, {"logprobs", std::move(logprobs)},
                                    {"finish_reason", reason_or_null(finish)}}})}};
}

std::string sse_event(const json& data) {
  // dump() escapes newlines inside strings, so one event is one line.
  return "data: " + wire_json(data) + "\n\n";
}

}  // namespace lode::server
