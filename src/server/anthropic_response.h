// Anthropic Messages response bodies: the `message` object, its streamed events (message_start,
// content_block_start / _delta / _stop, message_delta, message_stop) and their SSE framing with
// `event:` lines. Pure functions of what was generated, as openai_response.h is.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "chat/output_parser.h"
#include "engine/generate.h"
#include "server/openai_response.h"
#include "tokenizer/tokenizer.h"

namespace lode::server {

// "tool_use" when there are tool calls, else "end_turn" (the model ended, a cancel),
// "stop_sequence" or "max_tokens" (max_tokens or the context ran out).
const char* stop_reason(engine::FinishReason finish, bool has_tool_use);

// Which of the stop strings ended the generation (the one found first in its text), or nothing
// when it did not end at a stop string.
std::optional<std::string> matched_stop_sequence(const engine::GenerateResult& result,
                                                 const tokenizer::Tokenizer& tokenizer,
                                                 std::span<const std::string> stop);

// A tool_use block's id: unique per reply, "toolu_" + the message id's random part + "_" + index.
std::string tool_use_id(const std::string& message_id, int index);
// {type: "tool_use", id, name, input}
nlohmann::ordered_json tool_use_block(const chat::ToolCall& call, const std::string& id);

// {input_tokens (the prompt less its cached part), output_tokens (as completion_tokens),
// cache_creation_input_tokens: 0, cache_read_input_tokens (the cached part)}.
nlohmann::ordered_json anthropic_usage(int64_t prompt_tokens, int64_t output_tokens, int64_t cached_tokens);

// The whole reply: content [thinking (when any), text (when any), tool_use...], stop_reason,
// stop_sequence, usage. meta.id is "msg_...".
nlohmann::ordered_json anthropic_message(const ResponseMeta& meta, const chat::ParsedDelta& reply,
                                         const engine::GenerateResult& result,
                                         const std::optional<std::string>& stop_sequence);

// The first stream event: the message with empty content, no stop_reason, input usage (the whole
// prompt: what the prefix cache holds of it is known only once the request has a slot).
nlohmann::ordered_json message_start_event(const ResponseMeta& meta, int64_t input_tokens);
// message_delta: {stop_reason, stop_sequence}, the final usage (anthropic_usage), which clients
// take over the message_start's.
nlohmann::ordered_json message_delta_event(const char* stop_reason, const std::optional<std::string>& stop_sequence,
                                           const engine::GenerateResult& result);

// "event: TYPE\ndata: JSON\n\n", TYPE being the data's own "type".
std::string anthropic_sse(const nlohmann::ordered_json& data);

}  // namespace lode::server
