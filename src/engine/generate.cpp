#include "engine/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "engine/generation.h"

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

  const auto t0 = clock::now();
  std::vector<float> logits = engine::prefill(sequence, prompt, chunk);
  const auto t1 = clock::now();
  result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  for (int64_t i = 0; i < max_tokens; ++i) {
    if (i > 0) {
      if (sequence.position() >= sequence.max_context()) {
        result.finish = FinishReason::context_full;
        break;
      }
      logits = engine::decode(sequence, result.tokens.back());
    }
    const int32_t token = sampler.sample(logits);
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

namespace {

// The prompt, its last logits, and every position's final-normed hidden state (for the drafter).
std::vector<float> prefill_following(Sequence& sequence, Drafter& drafter, std::span<const int32_t> prompt,
                                     int64_t chunk) {
  Model& model = sequence.model();
  if (chunk <= 0 || model.chunks_prompts()) chunk = int64_t(prompt.size());
  std::vector<float> logits;
  for (size_t start = 0; start < prompt.size(); start += size_t(chunk)) {
    const auto part = prompt.subspan(start, std::min(prompt.size() - start, size_t(chunk)));
    const bool last = start + part.size() == prompt.size();
    StepRow row{.sequence = &sequence, .tokens = part, .logit_rows = last ? 1 : 0, .want_hidden = true};
    model.step(std::span(&row, 1));
    drafter.advance(part, row.hidden);
    if (last) logits = std::move(row.logits);
  }
  return logits;
}

// One verify window: `pending` and its drafts run as decode steps would, then sampled in order
// while each sample equals the next draft. The sequence (and the drafter) keep the window's tokens
// up to the last one sampled from; the token sampled after them is returned, or nothing when
// generation ended.
std::optional<int32_t> verify_window(Sequence& sequence, Drafter& drafter, Generation& generation, int32_t pending,
                                     const GenerateOptions& options, GenerateResult& stats) {
  const int64_t room = sequence.max_context() - sequence.position();
  std::vector<int32_t> window = {pending};
  const std::vector<int32_t> drafts = drafter.draft(pending, std::min(options.mtp, room - 1), options.mtp_min_p);
  window.insert(window.end(), drafts.begin(), drafts.end());
  const std::shared_ptr<const Checkpoint> before = drafts.empty() ? nullptr : sequence.checkpoint();
  StepRow row{.sequence = &sequence, .tokens = window, .logit_rows = int64_t(window.size()), .want_hidden = true,
              .as_decode = true};
  sequence.model().step(std::span(&row, 1));
  const int64_t vocab = sequence.model().vocab();
  size_t used = 0;  // window tokens whose logits were sampled from
  std::optional<int32_t> next;
  while (used < window.size()) {
    next = generation.step(std::span(row.logits).subspan(used * size_t(vocab), size_t(vocab)));
    ++used;
    if (!next || used == window.size() || *next != window[used]) break;
  }
  ++stats.windows;
  stats.drafted += int64_t(drafts.size());
  stats.accepted += int64_t(used) - 1;
  if (used < window.size()) {  // back to the last token sampled from, recomputed as the window did
    sequence.rewind(*before);
    StepRow again{.sequence = &sequence, .tokens = std::span(window).first(used), .logit_rows = 0, .as_decode = true};
    sequence.model().step(std::span(&again, 1));
  }
  const int64_t hidden = sequence.model().config().hidden;
  drafter.advance(std::span(window).first(used), std::span(row.hidden).first(used * size_t(hidden)));
  return next;
}

GenerateResult generate_with_drafts(Sequence& sequence, const tokenizer::Tokenizer& tokenizer,
                                    sample::Sampler& sampler, std::span<const int32_t> prompt,
                                    const GenerateOptions& options, const TextSink& on_text) {
  Drafter& drafter = sequence.drafter();
  // The drafter follows what generation committed; a sequence moved some other way starts it over
  // (drafts are then worse, never the output).
  if (drafter.rows() != std::max<int64_t>(sequence.position() - 1, 0)) drafter.reset();
  check_prompt_fits(sequence, prompt);
  for (int32_t t : prompt) sampler.accept(t);
  Generation generation(tokenizer, sampler, options, on_text, int64_t(prompt.size()));
  GenerateResult stats;
  std::optional<int32_t> next = generation.step(prefill_following(sequence, drafter, prompt, options.chunk));
  while (next) {
    if (sequence.position() >= sequence.max_context()) {
      generation.stop(FinishReason::context_full);
      break;
    }
    next = verify_window(sequence, drafter, generation, *next, options, stats);
  }
  GenerateResult result = generation.result();
  result.windows = stats.windows, result.drafted = stats.drafted, result.accepted = stats.accepted;
  return result;
}

}  // namespace

GenerateResult generate(Sequence& sequence, const tokenizer::Tokenizer& tokenizer, sample::Sampler& sampler,
                        std::span<const int32_t> prompt, const GenerateOptions& options, const TextSink& on_text) {
  if (options.mtp > 0) return generate_with_drafts(sequence, tokenizer, sampler, prompt, options, on_text);
  check_prompt_fits(sequence, prompt);
  for (int32_t t : prompt) sampler.accept(t);
  Generation generation(tokenizer, sampler, options, on_text, int64_t(prompt.size()));
  std::vector<float> logits = engine::prefill(sequence, prompt, options.chunk);
  while (const std::optional<int32_t> next = generation.step(logits)) {
    if (sequence.position() >= sequence.max_context()) {
      generation.stop(FinishReason::context_full);
      break;
    }
    logits = engine::decode(sequence, *next);
  }
  return generation.result();
}

std::string speed_report(const GenerateResult& r) {
  // The first generated token comes from the prompt's logits; the decode steps are the rest.
  const size_t steps = r.tokens.empty() ? 0 : r.tokens.size() - 1;
  std::string report =
      fmt::format("prompt: {} tokens in {:.2f} s ({:.1f} tok/s); generated: {} tokens in {:.2f} s ({:.1f} tok/s)",
                  r.prompt_tokens, r.prefill_seconds, double(r.prompt_tokens) / std::max(r.prefill_seconds, 1e-9),
                  r.tokens.size(), r.decode_seconds, steps ? double(steps) / std::max(r.decode_seconds, 1e-9) : 0.0);
  // Every token after the first was sampled in some window.
  if (r.windows > 0)
    report += fmt::format("; MTP: {} of {} drafts accepted ({:.1f}%), {:.2f} tokens per verify step of {:.2f} ms",
                          r.accepted, r.drafted, 100.0 * double(r.accepted) / double(std::max<int64_t>(r.drafted, 1)),
                          double(steps) / double(r.windows), 1e3 * r.decode_seconds / double(r.windows));
  return report;
}

}  // namespace lode::engine
