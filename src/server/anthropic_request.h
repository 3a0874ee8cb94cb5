// Anthropic Messages request bodies (POST /v1/messages), parsed and validated into the same
// ChatRequest the OpenAI chat route builds, so both share the template, the job and the output
// parser. The mapping: `system` becomes a leading system message; content blocks `text` join into
// the message's content, assistant `thinking` blocks into reasoning_content, `tool_use` blocks into
// tool calls, and each user `tool_result` block into a "tool" message (before the user's own text);
// tools' `input_schema` becomes the OpenAI-style `parameters`; `stop_sequences` are stop strings.
// Thinking is off unless `thinking: {type: "enabled"}` (Anthropic's default). Every problem is an
// ApiError whose message names the field, since Anthropic's error body has no `param`.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "server/openai_request.h"

namespace lode::server {

// random_seed: the sampler's seed (the Messages API has none).
ChatRequest parse_messages_request(const nlohmann::ordered_json& body, const ModelNames& names,
                                   uint64_t random_seed);

// POST /v1/messages/count_tokens: the same fields that shape the prompt (model, system, messages,
// tools, tool_choice, thinking), without max_tokens or sampling.
ChatRequest parse_count_tokens_request(const nlohmann::ordered_json& body, const ModelNames& names);

}  // namespace lode::server
