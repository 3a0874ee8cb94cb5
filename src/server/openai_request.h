// OpenAI request bodies, parsed and validated: /v1/chat/completions and /v1/completions. Every
// problem is an ApiError (400 naming the field, 404 for an unknown model) with a message that says
// what was wrong; fields this slice does not know are ignored, as OpenAI's own clients send extras.
// Then the prompt: the chat template rendered and tokenized, checked against the context.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sample/json_schema.h"
#include "chat/template.h"
#include "sample/sampler.h"
#include "server/engine_worker.h"
#include "server/served_model.h"

namespace lode::server {

// What both routes share.
struct GenerationRequest {
  std::optional<int64_t> max_tokens;  // unset: whatever room the context leaves
  sample::SamplingParams sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int logprobs = -1;           // engine::GenerateOptions::logprobs: -1 none, else the alternatives listed
  std::string model;           // the name the reply gives (json_fields.h: check_model)
};

struct ChatRequest {
  GenerationRequest generation;
  std::vector<chat::Message> messages;
  nlohmann::ordered_json tools;  // the tool definitions, or null (none, or tool_choice "none")
  bool enable_thinking = true;
  // tool_choice forcing a call ("required" / a named function; Anthropic "any" / "tool"): the
  // names the reply may call; the reply is steered into "<tool_call><function=NAME>" once thinking
  // ends (engine::SteeredText), the arguments are the model's. Empty: not forced.
  std::vector<std::string> forced_tools;
  // response_format json_object or json_schema: the reply's content is one JSON object (of the
  // schema's); null: free text.
  std::shared_ptr<const sample::JsonSchema> json_reply;

  // The last message is the assistant's reply begun (a prefill, as Anthropic's API and llama-server
  // take it): the model goes on from its content, after its thinking.
  bool continues_reply() const { return !messages.empty() && messages.back().role == "assistant"; }
  // Whether the reply opens inside a <think> block (where the output parser starts).
  bool reply_thinks() const { return enable_thinking && !continues_reply(); }
};

struct CompletionRequest {
  GenerationRequest generation;
  std::string prompt;
  std::shared_ptr<const sample::JsonSchema> json_reply;  // response_format, as the chat route's (vLLM takes it here too)
};

// The tool names a forcing tool_choice allows: every tool (`name` empty) or the one named, which
// must be among `tools` (OpenAI-style definitions); 400 on `param` otherwise, or without tools.
std::vector<std::string> forced_tool_names(const nlohmann::ordered_json& tools, const std::string& name,
                                           const std::string& param);

// The body as JSON; 400 saying where parsing failed, or that it is not an object.
nlohmann::ordered_json parse_json_body(const std::string& body);

// random_seed: the seed used when the request gives none.
ChatRequest parse_chat_request(const nlohmann::ordered_json& body, const ModelNames& names, uint64_t random_seed);
CompletionRequest parse_completion_request(const nlohmann::ordered_json& body, const ModelNames& names,
                                           uint64_t random_seed);

// The conversation through the chat template, as tokens (any length); 400 when the template refuses
// it. Control tokens are read only where the template wrote them: text in the messages that spells
// one (<|im_start|>) is ordinary text, as OpenAI's API reads it, so a message cannot write roles.
std::vector<int32_t> chat_prompt(const ChatRequest& request, const ServedModel& model);

// The rendered (chat) or raw (completion) prompt as tokens, with max_tokens resolved against the
// context; 400 when the template refuses the conversation or prompt + max_tokens do not fit.
Job chat_job(const ChatRequest& request, const ServedModel& model, int64_t context);
Job completion_job(const CompletionRequest& request, const ServedModel& model, int64_t context);

}  // namespace lode::server
