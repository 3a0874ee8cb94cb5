#include "engine/speculative.h"

#include <algorithm>

#include "engine/generation.h"

namespace lode::engine {
namespace {

struct DraftCounts {
  int64_t windows = 0, drafted = 0, accepted = 0;
};

// The prompt through the sequence in chunks, the drafter following each; the last position's logits.
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
                                     const GenerateOptions& options, DraftCounts& counts) {
  // A window of n tokens yields at most n samples: no more than the context and the token limit hold.
  const int64_t room = sequence.max_context() - sequence.position();
  const int64_t left = options.max_tokens - int64_t(generation.result().tokens.size());
  std::vector<int32_t> window = {pending};
  const std::vector<int32_t> drafts =
      drafter.draft(pending, std::max<int64_t>(std::min({options.mtp, room - 1, left - 1}), 0), options.mtp_min_p);
  window.insert(window.end(), drafts.begin(), drafts.end());
  const std::shared_ptr<const Checkpoint> before = drafts.empty() ? nullptr : sequence.checkpoint();
  StepRow row{.sequence = &sequence, .tokens = window, .logit_rows = int64_t(window.size()), .want_hidden = true,
              .as_decode = true};
  sequence.model().step(std::span(&row, 1));
  const int64_t vocab = sequence.model().vocab();
  size_t used = 0;  // window tokens whose logits were sampled from
  std::optional<int32_t> next;
  try {
    while (used < window.size()) {
      next = generation.step(std::span(row.logits).subspan(used * size_t(vocab), size_t(vocab)));
      ++used;
      if (!next || used == window.size() || *next != window[used]) break;
    }
  } catch (...) {  // the text sink failed: leave the sequence as it was before the window
    if (before) sequence.rewind(*before);
    throw;
  }
  ++counts.windows;
  counts.drafted += int64_t(drafts.size());
  counts.accepted += int64_t(used) - 1;
  if (used < window.size()) {  // back to the last token sampled from, recomputed as the window did
    sequence.rewind(*before);
    StepRow again{.sequence = &sequence, .tokens = std::span(window).first(used), .logit_rows = 0, .as_decode = true};
    sequence.model().step(std::span(&again, 1));
  }
  const int64_t hidden = sequence.model().config().hidden;
  drafter.advance(std::span(window).first(used), std::span(row.hidden).first(used * size_t(hidden)));
  return next;
}

}  // namespace

GenerateResult generate_with_drafts(Sequence& sequence, const tokenizer::Tokenizer& tokenizer,
                                    sample::Sampler& sampler, std::span<const int32_t> prompt,
                                    const GenerateOptions& options, const TextSink& on_text) {
  Drafter& drafter = sequence.drafter();
  // The drafter follows what generation committed; a sequence moved some other way starts it over
  // (drafts are then worse, never the output).
  if (drafter.followed() != sequence.position()) drafter.reset(sequence.position());
  check_prompt_fits(sequence, prompt);
  for (int32_t t : prompt) sampler.accept(t);
  Generation generation(tokenizer, sampler, options, on_text, int64_t(prompt.size()));
  DraftCounts counts;
  std::optional<int32_t> next = generation.step(prefill_following(sequence, drafter, prompt, options.chunk));
  while (next) {
    if (sequence.position() >= sequence.max_context()) {
      generation.stop(FinishReason::context_full);
      break;
    }
    next = verify_window(sequence, drafter, generation, *next, options, counts);
  }
  GenerateResult result = generation.result();
  result.windows = counts.windows;
  result.drafted = counts.drafted;
  result.accepted = counts.accepted;
  return result;
}

}  // namespace lode::engine
