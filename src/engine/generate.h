// Text generation on one sequence: prefill a prompt, then sample token by token until an
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

#include "cpu/session.h"
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
};

enum class FinishReason { end_of_generation, stop_string, length, cancelled, context_full };
const char* to_string(FinishReason reason);

struct GenerateResult {
  std::vector<int32_t> tokens;  // sampled tokens, the stopping one included
  // The last sampled token has not been run through the model yet (generation stops before
  // decoding it); a conversation that continues feeds it first.
  bool last_token_pending = false;
  FinishReason finish = FinishReason::length;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // of the prompt, reused from an earlier request (set by a server)
  double prefill_seconds = 0;
  double decode_seconds = 0;  // time of the steps after the first token
};

using TextSink = std::function<void(std::string_view text)>;
using TokenSink = std::function<bool(int32_t token)>;  // false: stop after this token

// What generation needs of a model holding one sequence: the CPU engine's session or the CUDA one.
class SequenceModel {
 public:
  virtual ~SequenceModel() = default;
  // Appends tokens (`chunk` at a time where the engine chunks); the last position's logits.
  virtual std::vector<float> prefill(std::span<const int32_t> tokens, int64_t chunk) = 0;
  // The same, returning the logits of every new position, [tokens.size()][vocab()].
  virtual std::vector<float> prefill_all(std::span<const int32_t> tokens, int64_t chunk) = 0;
  virtual std::vector<float> decode(int32_t token) = 0;
  virtual void reset() = 0;  // an empty sequence
  virtual int64_t position() const = 0;
  virtual int64_t max_context() const = 0;
  virtual int64_t vocab() const = 0;
  // A line for the run log about what the engine did beyond the tokens (the GPU's expert tier:
  // hit rate, bytes over PCIe, swaps); empty when there is nothing to say.
  virtual std::string activity() const { return {}; }
};

// The CPU session as a SequenceModel: one the caller keeps, or one it owns.
class CpuSequence final : public SequenceModel {
 public:
  explicit CpuSequence(cpu::Session& session) : session_(session) {}
  explicit CpuSequence(std::unique_ptr<cpu::Session> owned) : owned_(std::move(owned)), session_(*owned_) {}
  std::vector<float> prefill(std::span<const int32_t> tokens, int64_t chunk) override {
    return session_.prefill(tokens, chunk);
  }
  std::vector<float> prefill_all(std::span<const int32_t> tokens, int64_t chunk) override {
    return session_.prefill(tokens, chunk, true);
  }
  std::vector<float> decode(int32_t token) override { return session_.decode(token); }
  void reset() override { session_.reset(); }
  int64_t position() const override { return session_.position(); }
  int64_t max_context() const override { return session_.max_context(); }
  int64_t vocab() const override { return session_.vocab(); }

 private:
  std::unique_ptr<cpu::Session> owned_;
  cpu::Session& session_;
};

// Fails, saying how much room is left, unless `prompt` is non-empty and fits the session's context.
void check_prompt_fits(const SequenceModel& session, std::span<const int32_t> prompt);
void check_prompt_fits(const cpu::Session& session, std::span<const int32_t> prompt);

// The sampling loop alone: appends `prompt`, then samples up to max_tokens, calling on_token after
// each; finish is `length` unless on_token stopped it (then end_of_generation) or the session's
// context filled up (context_full). Fails, saying how much room is left, when the prompt itself
// does not fit.
GenerateResult generate_tokens(SequenceModel& session, sample::Sampler& sampler,
                               std::span<const int32_t> prompt, int64_t max_tokens, int64_t chunk,
                               const TokenSink& on_token);
GenerateResult generate_tokens(cpu::Session& session, sample::Sampler& sampler,
                               std::span<const int32_t> prompt, int64_t max_tokens, int64_t chunk,
                               const TokenSink& on_token);

// Appends `prompt` to the session (it may already hold earlier turns) and generates. The sampler
// keeps its history across calls, so penalties see the whole conversation.
GenerateResult generate(SequenceModel& session, const tokenizer::Tokenizer& tokenizer,
                        sample::Sampler& sampler, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const TextSink& on_text);
GenerateResult generate(cpu::Session& session, const tokenizer::Tokenizer& tokenizer,
                        sample::Sampler& sampler, std::span<const int32_t> prompt,
                        const GenerateOptions& options, const TextSink& on_text);

// "prompt: 12 tokens in 0.10 s (120.0 tok/s); generated: 32 tokens in 1.00 s (31.0 tok/s)"
std::string speed_report(const GenerateResult& result);

}  // namespace lode::engine
