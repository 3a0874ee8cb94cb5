// One sequence's generation as a step machine: given the model's logits it samples the next token,
// streams its text (whole UTF-8 characters, stop strings held back until decided) and says which
// token to run next, or that generation has ended. engine::generate drives it on one session; the
// server's scheduler drives many at once, batching their model steps.
#pragma once

#include <chrono>
#include <optional>
#include <span>
#include <utility>
#include <variant>
#include <vector>

#include "engine/generate.h"
#include "sample/json_schema.h"
#include "sample/stop.h"

namespace lode::engine {

class Generation {
 public:
  // The sampler must already have accepted the prompt (penalties see it). Timing starts now: the
  // prompt's prefill is expected to follow.
  Generation(const tokenizer::Tokenizer& tokenizer, sample::Sampler& sampler,
             const GenerateOptions& options, TextSink on_text, int64_t prompt_tokens);

  // The logits after the prompt or after the token last returned: samples and streams. Returns
  // the token to run through the model next, or nullopt when generation has ended.
  std::optional<int32_t> step(std::span<const float> logits);
  // Whether the next token is the greedy token of the logits (Sampler::plain_greedy, no steering
  // under way): the driver may then ask the engine for that token alone (engine::decode_greedy)
  // and give it to step_chosen.
  bool greedy_only() const;
  // step() for the token greedy_only() says the logits would give.
  std::optional<int32_t> step_chosen(int32_t token);
  // Whether the next token can come from the logits' top candidates (Sampler::takes_top, no
  // steering under way): the driver may ask the engine for those alone (engine::decode_top).
  bool top_only() const;
  // The ids the top candidates set aside (Sampler::top_aside: what the bias and penalties change).
  std::vector<int32_t> top_aside() const { return sampler_.top_aside(); }
  // step() from the top candidates of the logits (sample::top_candidates, kTopCandidates, those ids
  // set aside).
  std::optional<int32_t> step_top(const sample::TopCandidates& top);
  // Ends generation from outside (the context is full, the request was cancelled).
  void stop(FinishReason reason);

  // With GenerateOptions::logprobs: how many of result().logprobs the text streamed so far has
  // shown (an entry counts once its token's first byte has gone out). Read from the text sink, the
  // entries [n before, n now) are those of the text just streamed.
  size_t shown_logprobs() const;

  bool done() const { return done_; }
  // The result so far (complete once done()).
  const GenerateResult& result() const { return result_; }

 private:
  bool begin_step();                           // false: generation has ended
  std::optional<int32_t> take(int32_t token);  // the chosen token: stream it, say what runs next
  void end(FinishReason reason, bool flush);
  void emit(const std::string& text);  // to the text sink, counted
  void note_logprobs(std::span<const float> logits, int32_t token);
  // The logits with every token that would leave all steered choices set to -infinity.
  std::vector<float> steered(std::span<const float> logits) const;
  void follow_steering(int32_t token);
  // The logits with every token that would leave the text no beginning of a JSON object (of the
  // schema's, where there is one) set to -infinity (GenerateOptions::json).
  std::span<const float> json_only(std::span<const float> logits);  // (into json_masked_)
  void follow_json(int32_t token);
  // Whether the row must be masked before sampling (steering or JSON under way).
  bool constrained() const { return steering_ == Steering::active || json_ == Json::active; }

  const tokenizer::Tokenizer& tokenizer_;
  sample::Sampler& sampler_;
  const GenerateOptions& options_;
  TextSink on_text_;
  tokenizer::TextStream text_;
  sample::StopMatcher stops_;
  GenerateResult result_;
  bool done_ = false;
  enum class Steering { none, waiting, active, done } steering_ = Steering::none;
  std::string steered_text_;  // written since steering began
  enum class Json { none, waiting, active } json_ = Json::none;
  // What has been written since the JSON began: any object's beginning (JsonPrefix, a tenth of
  // SchemaPrefix's size, which the mask copies at every byte it tries), or the schema's.
  std::variant<sample::JsonPrefix, sample::SchemaPrefix> json_text_;
  std::shared_ptr<const sample::JsonSchema> json_schema_;  // (what a SchemaPrefix reads against)
  bool json_complete() const {
    return std::visit([](const auto& text) { return text.complete(); }, json_text_);
  }
  std::shared_ptr<const sample::JsonTokens> json_vocabulary_;
  std::vector<uint8_t> json_allowed_;  // the mask's scratch
  std::vector<float> json_masked_;     // the masked row
  // Each steered choice's user-defined added tokens (<tool_call>, <think>), as encode reads them:
  // (byte offset, id), in order. Steering takes them as their tokens, never spelled in pieces.
  std::vector<std::vector<std::pair<size_t, int32_t>>> added_in_choices_;
  std::chrono::steady_clock::time_point started_, first_token_;
  // Bytes of text the sampled tokens make (counted with logprobs only) and bytes streamed; where
  // each logprobs entry's token begins in that text.
  int64_t text_bytes_ = 0, streamed_bytes_ = 0;
  std::vector<int64_t> logprob_starts_;
};

}  // namespace lode::engine
