// Text generation on one sequence (engine/engine.h): prefill a prompt, then sample token by token until an
// end-of-generation token, a stop string, or the token limit; text is streamed in whole UTF-8
// characters with stop strings held back until decided. Used by `lode run` and `lode chat`.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "sample/json_tokens.h"
#include "sample/logprobs.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace lode::engine {

// Steering the reply into one of several texts (a forced tool call): once the token `after` has
// been sampled (-1: from the first token on), each next token is sampled only among those that
// keep the text written since a prefix of one of `choices` (control tokens excluded), until one of
// them is complete; then sampling is free again. The model still picks among the choices with its
// own (masked) probabilities.
struct SteeredText {
  int32_t after = -1;
  std::vector<std::string> choices;
};

// The reply as one JSON object (`response_format` json_object, or json_schema with `schema`): once
// the token `after` has been sampled (-1: from the first token on), each token is sampled only
// among those that keep the text since the beginning of a JSON object the schema accepts
// (sample/json_schema.h; added and control tokens excluded), with the model's own masked
// probabilities; once the object closes, only an end-of-generation token may follow.
struct JsonOutput {
  int32_t after = -1;
  std::shared_ptr<const sample::JsonSchema> schema = nullptr;  // null: any object
  // The tokenizer's tokens as the mask reads them (json_vocabulary), made once and shared by the
  // replies of a server; null: made for this reply (~0.15 s on a 248,320-token vocabulary).
  std::shared_ptr<const sample::JsonTokens> vocabulary = nullptr;
};
std::shared_ptr<const sample::JsonTokens> json_vocabulary(const tokenizer::Tokenizer& tokenizer);

struct GenerateOptions {
  int64_t max_tokens = 256;
  sample::SamplingParams sampling;
  std::vector<std::string> stop_strings;
  bool stop_at_end_of_generation = true;  // eos, <|im_end|>, <|endoftext|>
  bool render_special = false;            // show control tokens in the streamed text
  int64_t chunk = 64;                     // prompt tokens per forward chunk
  // Set by another thread (a server whose client went away, a shutdown): checked after every
  // sampled token; generation then stops, drops held-back text and finishes `cancelled`.
  // Null: never cancelled.
  const std::atomic<bool>* cancel = nullptr;
  std::optional<SteeredText> steer;
  // Speculative decoding with the model's MTP block (Sequence::drafter): up to `mtp` drafted tokens
  // per step, fewer where the block's confidence falls below mtp_min_p; 0: off. The window is
  // verified in one step computed as decode steps are, and each of its tokens is sampled from the
  // model's own logits exactly as without drafts, so the output is the same, greedy or sampled.
  int64_t mtp = 0;
  float mtp_min_p = 0.0f;
  // Each sampled token's log-probability and those of the `logprobs` likeliest tokens (0 to
  // sample::kMaxTopLogprobs; sample/logprobs.h says of which distribution); -1: none. Every step
  // then needs its whole row of logits (no greedy or top-candidates shortcut).
  int logprobs = -1;
  std::optional<JsonOutput> json = std::nullopt;  // (not with steer)
};

enum class FinishReason { end_of_generation, stop_string, length, cancelled, context_full };
const char* to_string(FinishReason reason);

struct GenerateResult {
  std::vector<int32_t> tokens;  // sampled tokens, the stopping one included
  // With GenerateOptions::logprobs: one entry per token whose text the reply shows, in order (not
  // the end-of-generation token, nor tokens held back as part of a stop string).
  std::vector<sample::TokenLogprobs> logprobs;
  // The last sampled token has not been run through the model yet (generation stops before
  // decoding it); a conversation that continues feeds it first.
  bool last_token_pending = false;
  FinishReason finish = FinishReason::length;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // of the prompt, reused from an earlier request (set by a server)
  double prefill_seconds = 0;
  double decode_seconds = 0;  // time of the steps after the first token
  // With drafts (GenerateOptions::mtp): verify windows run, tokens drafted, drafts accepted.
  int64_t windows = 0, drafted = 0, accepted = 0;
  double draft_seconds = 0, verify_seconds = 0, follow_seconds = 0;  // of decode_seconds (WindowCounts)
  // Readying the decode steps before the prompt (Sequence::ready_steps; 0 where the backend had
  // nothing to ready), in neither time above.
  double ready_seconds = 0;
};

using TextSink = std::function<void(std::string_view text)>;
using TokenSink = std::function<bool(int32_t token)>;  // false: stop after this token

// Fails, saying how much room is left, unless `prompt` is non-empty and fits the sequence's context.
void check_prompt_fits(const Sequence& sequence, std::span<const int32_t> prompt);

// The sampling loop alone: appends `prompt`, then samples up to max_tokens, calling on_token after
// each; finish is `length` unless on_token stopped it (then end_of_generation) or the sequence's
// context filled up (context_full). Fails, saying how much room is left, when the prompt itself
// does not fit.
GenerateResult generate_tokens(Sequence& sequence, sample::Sampler& sampler, std::span<const int32_t> prompt,
                               int64_t max_tokens, int64_t chunk, const TokenSink& on_token);

// Appends `prompt` to the sequence (it may already hold earlier turns) and generates. The sampler
// keeps its history across calls, so penalties see the whole conversation.
GenerateResult generate(Sequence& sequence, const tokenizer::Tokenizer& tokenizer, sample::Sampler& sampler,
                        std::span<const int32_t> prompt, const GenerateOptions& options, const TextSink& on_text);

// Readies the sequence's coming decode steps (Sequence::ready_steps) as a generation with this
// sampler and these options asks for them, before its prompt: the seconds it took (0 where the
// backend had nothing to ready).
double ready_decode_steps(Sequence& sequence, const sample::Sampler& sampler, const GenerateOptions& options);

// "prompt: 12 tokens in 0.10 s (120.0 tok/s); generated: 32 tokens in 1.00 s (31.0 tok/s)"
std::string speed_report(const GenerateResult& result);

}  // namespace lode::engine
