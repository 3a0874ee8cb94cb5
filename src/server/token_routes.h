// POST /tokenize and /detokenize, as llama-server and vLLM answer them (clients use them to count
// and check tokens): pure functions of the request body and the model, so tests can call them.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>

#include "server/served_model.h"

namespace lode::server {

// Body: the text as `content` (llama-server) or `prompt` (vLLM), or a chat as `messages` (with
// `tools`, thinking as the chat route reads them: the prompt that route would render);
// `parse_special` (default true: text that spells a control token is that token, as /v1/completions
// reads its prompt), `with_pieces` (each token as {id, piece}), `model`. Reply: {tokens, count,
// max_model_len}. 400 (ApiError) saying what is wrong.
nlohmann::ordered_json tokenize_reply(const nlohmann::ordered_json& body, const ServedModel& model,
                                      const ModelNames& names, int64_t context);
// Body: `tokens`, a list of token ids. Reply: {content (llama-server), prompt (vLLM)}: the text, the
// control tokens spelled out.
nlohmann::ordered_json detokenize_reply(const nlohmann::ordered_json& body, const ServedModel& model,
                                        const ModelNames& names);

}  // namespace lode::server
