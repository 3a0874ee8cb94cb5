#include "engine/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/generation.h"
#include "engine/speculative.h"

namespace lode::engine {

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::end_of_generation: return "end of generation";
    case FinishReason::stop_string: return "stop string";
    case FinishReason::length: return "token limit";
    case FinishReason::context_full: return "full context";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

namespace {

void check_room(int64_t position, int64_t max_context, std::span<const int32_t> prompt) {
  if (prompt.empty()) fail("the prompt is empty: give at least one token of text");
  const int64_t room = max_context - position;
  if (int64_t(prompt.size()) > room)
    fail("the prompt needs {} tokens but only {} of the context's {} are left (start over, or raise --ctx)",
         prompt.size(), room, max_context);
}

}  // namespace

double ready_decode_steps(Sequence& sequence, const sample::Sampler& sampler, const GenerateOptions& options) {
  using Output = StepsAhead::Output;
  // As the loops below ask: the greedy token, else the top candidates of one-token steps, else
  // (logprobs, other samplers, sampled windows) the logits.
  const bool whole_rows = options.logprobs >= 0;
  const Output output = whole_rows                                  ? Output::logits
                        : sampler.plain_greedy()                    ? Output::greedy
                        : sampler.takes_top() && options.mtp <= 0 ? Output::top
                                                                    : Output::logits;
  const auto start = std::chrono::steady_clock::now();
  const bool readied =
      sequence.ready_steps({.tokens = 1 + std::max<int64_t>(options.mtp, 0), .output = output, .drafts = options.mtp > 0});
  return readied ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() : 0.0;
}

void check_prompt_fits(const Sequence& sequence, std::span<const int32_t> prompt) {
  check_room(sequence.position(), sequence.max_context(), prompt);
}

GenerateResult generate_tokens(Sequence& sequence, sample::Sampler& sampler, std::span<const int32_t> prompt,
                               int64_t max_tokens, int64_t chunk, const TokenSink& on_token) {
  check_prompt_fits(sequence, prompt);
  using clock = std::chrono::steady_clock;
  GenerateResult result;
  result.prompt_tokens = int64_t(prompt.size());
  for (int32_t t : prompt) sampler.accept(t);
  result.ready_seconds = ready_decode_steps(sequence, sampler, {});

  const auto t0 = clock::now();
  const std::vector<float> prompt_logits = engine::prefill(sequence, prompt, chunk);
  const auto t1 = clock::now();
  result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  for (int64_t i = 0; i < max_tokens; ++i) {
    int32_t token = 0;
    if (i == 0) {
      token = sampler.sample(prompt_logits);
    } else if (sequence.position() >= sequence.max_context()) {
      result.finish = FinishReason::context_full;
      break;
    } else if (sampler.plain_greedy()) {  // the engine chooses (on the GPU, where the logits are)
      token = engine::decode_greedy(sequence, result.tokens.back());
    } else if (sampler.takes_top()) {  // from the best 64 (found on the GPU, where the logits are)
      token = sampler.sample_top(engine::decode_top(sequence, result.tokens.back(), sampler.top_aside()));
    } else {
      token = sampler.sample(engine::decode(sequence, result.tokens.back()));
    }
    sampler.accept(token);
    result.tokens.push_back(token);
    result.last_token_pending = true;
    if (!on_token(token)) {
      result.finish = FinishReason::end_of_generation;
      break;
    }
  }
  result.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return result;
}

GenerateResult generate(Sequence& sequence, const tokenizer::Tokenizer& tokenizer, sample::Sampler& sampler,
                        std::span<const int32_t> prompt, const GenerateOptions& options, const TextSink& on_text) {
  if (options.mtp > 0) return generate_with_drafts(sequence, tokenizer, sampler, prompt, options, on_text);
  check_prompt_fits(sequence, prompt);
  for (int32_t t : prompt) sampler.accept(t);
  const double ready = ready_decode_steps(sequence, sampler, options);
  Generation generation(tokenizer, sampler, options, on_text, int64_t(prompt.size()));
  std::optional<int32_t> next = generation.step(engine::prefill(sequence, prompt, options.chunk));
  while (next) {
    if (sequence.position() >= sequence.max_context()) {
      generation.stop(FinishReason::context_full);
      break;
    }
    // Greedy without bias, penalties or steering: the engine chooses (on the GPU, where the logits
    // are); sampling that needs only the best 64: the engine finds them.
    next = generation.greedy_only() ? generation.step_chosen(engine::decode_greedy(sequence, *next))
           : generation.top_only()  ? generation.step_top(engine::decode_top(sequence, *next, generation.top_aside()))
                                    : generation.step(engine::decode(sequence, *next));
  }
  GenerateResult result = generation.result();
  result.ready_seconds = ready;
  return result;
}

std::string speed_report(const GenerateResult& r) {
  // The first generated token comes from the prompt's logits; the decode steps are the rest.
  const size_t steps = r.tokens.empty() ? 0 : r.tokens.size() - 1;
  std::string report =
      fmt::format("prompt: {} tokens in {:.2f} s ({:.1f} tok/s); generated: {} tokens in {:.2f} s ({:.1f} tok/s)",
                  r.prompt_tokens, r.prefill_seconds, double(r.prompt_tokens) / std::max(r.prefill_seconds, 1e-9),
                  r.tokens.size(), r.decode_seconds, steps ? double(steps) / std::max(r.decode_seconds, 1e-9) : 0.0);
  // Every token after the first was sampled in some window.
  if (r.windows > 0) {
    const double ms = 1e3 / double(r.windows);  // per window
    const double timed = r.draft_seconds + r.verify_seconds + r.follow_seconds;
    report += fmt::format("; MTP: {} of {} drafts accepted ({:.1f}%), {:.2f} tokens per verify step of {:.3f} ms",
                          r.accepted, r.drafted, 100.0 * double(r.accepted) / double(std::max<int64_t>(r.drafted, 1)),
                          double(steps) / double(r.windows), r.decode_seconds * ms);
    if (timed > 0)
      report += fmt::format(" (drafting {:.3f}, verifying {:.3f}, the drafter following {:.3f}, sampling and the rest {:.3f})",
                            r.draft_seconds * ms, r.verify_seconds * ms, r.follow_seconds * ms,
                            std::max(r.decode_seconds - timed, 0.0) * ms);
  }
  if (r.ready_seconds > 0) report += fmt::format("; steps readied before the prompt in {:.1f} ms", r.ready_seconds * 1e3);
  return report;
}

}  // namespace lode::engine
