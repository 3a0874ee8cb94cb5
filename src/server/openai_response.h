// OpenAI response bodies: chat.completion and text_completion objects, their streamed chunks, and
// Server-Sent Events framing. Pure functions of what was generated, so tests can check them alone.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chat/output_parser.h"
#include "engine/generate.h"
#include "sample/logprobs.h"
#include "tokenizer/tokenizer.h"

namespace lode::server {

// What every object and chunk of one response carries.
struct ResponseMeta {
  std::string id;       // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// "tool_calls" when there are any, else "stop" (the model ended, a stop string, a cancel) or
// "length" (max_tokens or the context ran out).
const char* finish_reason(engine::FinishReason finish, bool has_tool_calls);

// {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details: {cached_tokens: 0}};
// completion_tokens counts the sampled tokens, the one that ended generation included.
nlohmann::ordered_json usage_json(const engine::GenerateResult& result);

// Logprobs entries (sample/logprobs.h) in the chat route's form: {content: [{token, logprob, bytes,
// top_logprobs: [{token, logprob, bytes}]}], refusal: null}. A token's text is as the tokenizer
// spells it (control tokens by name; bytes that are not whole UTF-8 characters go out as U+FFFD
// in `token`, exact in `bytes`); a log-probability of -inf is -9999.0, as OpenAI's.
nlohmann::ordered_json chat_logprobs(std::span<const sample::TokenLogprobs> entries,
                                     const tokenizer::Tokenizer& tokenizer);
// The legacy completions route's form: {tokens, token_logprobs, top_logprobs ({token: logprob},
// the alternatives and the sampled token), text_offset (characters before each token, counted from
// `offset`, which it advances)}. Tokens as the reply's text shows them (a control token as none),
// "bytes:\xNN..." where a token holds part of a UTF-8 character, as OpenAI's.
nlohmann::ordered_json completion_logprobs(std::span<const sample::TokenLogprobs> entries,
                                           const tokenizer::Tokenizer& tokenizer, int64_t& offset);

// A whole reply, parsed: message {role, content (null when empty and there are tool calls),
// reasoning_content (when not empty), tool_calls (when any)}; choices[0].logprobs as given (null:
// not asked for).
nlohmann::ordered_json chat_completion(const ResponseMeta& meta, const chat::ParsedDelta& reply,
                                       const engine::GenerateResult& result,
                                       nlohmann::ordered_json logprobs = nullptr);
// One chat.completion.chunk; finish_reason null unless given.
nlohmann::ordered_json chat_chunk(const ResponseMeta& meta, nlohmann::ordered_json delta,
                                  const char* finish_reason = nullptr);
// The chunks for a piece of parsed output: reasoning, then content, then each completed tool call
// (index, id, type, function name and the full arguments in one delta). next_tool_index counts the
// calls streamed so far.
std::vector<nlohmann::ordered_json> chat_delta_chunks(const ResponseMeta& meta, const chat::ParsedDelta& delta,
                                                      int& next_tool_index);
// The chunk after the last choice chunk when stream_options.include_usage: empty choices, usage.
// object: "chat.completion.chunk", or "text_completion" for /v1/completions.
nlohmann::ordered_json usage_chunk(const ResponseMeta& meta, const engine::GenerateResult& result,
                                   const char* object = "chat.completion.chunk");

nlohmann::ordered_json text_completion(const ResponseMeta& meta, const std::string& text,
                                       const engine::GenerateResult& result,
                                       nlohmann::ordered_json logprobs = nullptr);
nlohmann::ordered_json text_completion_chunk(const ResponseMeta& meta, const std::string& text,
                                             const char* finish_reason = nullptr,
                                             nlohmann::ordered_json logprobs = nullptr);

// "data: JSON\n\n", and the stream's last event.
std::string sse_event(const nlohmann::ordered_json& data);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace lode::server
