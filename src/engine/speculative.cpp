#include "engine/speculative.h"

#include <algorithm>
#include <chrono>

namespace lode::engine {

namespace {

// Runs work, adding its wall time to seconds.
template <class Work>
auto timed(double& seconds, Work&& work) {
  const auto start = std::chrono::steady_clock::now();
  struct Add {
    double& seconds;
    std::chrono::steady_clock::time_point start;
    ~Add() { seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
  } add{seconds, start};
  return work();
}

}  // namespace

void follow(const Sequence& sequence, Drafter& drafter, std::span<const int32_t> tokens,
            std::span<const float> hidden) {
  const int64_t from = sequence.position() - int64_t(tokens.size());
  if (drafter.followed() != from) drafter.reset(from);  // moved some other way: drafts get worse, never the output
  drafter.advance(tokens, hidden);
}

std::vector<int32_t> next_window(const Sequence& sequence, Drafter& drafter, const Generation& generation,
                                 int32_t pending, const GenerateOptions& options) {
  // A window of n tokens yields at most n samples: no more than the context and the token limit hold.
  const int64_t room = sequence.max_context() - sequence.position();
  const int64_t left = options.max_tokens - int64_t(generation.result().tokens.size());
  const int64_t n = std::max<int64_t>(std::min({options.mtp, room - 1, left - 1}), 0);
  std::vector<int32_t> window = {pending};
  if (n > 0 && drafter.followed() == sequence.position()) {
    const std::vector<int32_t> drafts = drafter.draft(pending, n, options.mtp_min_p);
    window.insert(window.end(), drafts.begin(), drafts.end());
  }
  return window;
}

StepRow verify_row(Sequence& sequence, std::span<const int32_t> window, bool greedy_only) {
  return {.sequence = &sequence, .tokens = window, .logit_rows = int64_t(window.size()), .want_hidden = true,
          .as_decode = true, .greedy_only = greedy_only};
}

std::shared_ptr<const Checkpoint> window_checkpoint(const Sequence& sequence, std::span<const int32_t> window) {
  return window.size() > 1 && !sequence.cuts_windows() ? sequence.checkpoint() : nullptr;
}

std::optional<int32_t> accept_window(Sequence& sequence, Drafter& drafter, Generation& generation,
                                     std::span<const int32_t> window, const StepRow& row, const Checkpoint* before,
                                     WindowCounts& counts) {
  const int64_t vocab = sequence.model().vocab();
  size_t used = 0;  // window tokens whose logits were sampled from
  std::optional<int32_t> next;
  try {
    while (used < window.size()) {
      if (row.greedy_only && used > 0 && !generation.greedy_only()) break;  // (it held when the row was made)
      next = row.greedy_only ? generation.step_chosen(row.greedy.at(used))
                             : generation.step(std::span(row.logits).subspan(used * size_t(vocab), size_t(vocab)));
      ++used;
      if (!next || used == window.size() || *next != window[used]) break;
    }
  } catch (...) {  // the text sink failed: leave the sequence as it was before the window
    if (before) sequence.rewind(*before);
    else if (window.size() > 1 && sequence.cuts_windows()) sequence.cut_window(0);
    throw;
  }
  ++counts.windows;
  counts.drafted += int64_t(window.size()) - 1;
  counts.accepted += int64_t(used) - 1;
  if (used < window.size() && sequence.cuts_windows()) {  // back to the last token sampled from
    sequence.cut_window(int64_t(used));
  } else if (used < window.size()) {  // likewise, recomputed as the window did
    sequence.rewind(*before);
    StepRow again{.sequence = &sequence, .tokens = window.first(used), .logit_rows = 0, .as_decode = true};
    sequence.model().step(std::span(&again, 1));
  }
  const int64_t hidden = sequence.model().config().hidden;
  timed(counts.follow_seconds,
        [&] { follow(sequence, drafter, window.first(used), std::span(row.hidden).first(used * size_t(hidden))); });
  return next;
}

GenerateResult generate_with_drafts(Sequence& sequence, const tokenizer::Tokenizer& tokenizer,
                                    sample::Sampler& sampler, std::span<const int32_t> prompt,
                                    const GenerateOptions& options, const TextSink& on_text) {
  Drafter& drafter = sequence.drafter();
  check_prompt_fits(sequence, prompt);
  for (int32_t t : prompt) sampler.accept(t);
  Generation generation(tokenizer, sampler, options, on_text, int64_t(prompt.size()));
  WindowCounts counts;
  const auto follow_chunk = [&](std::span<const int32_t> tokens, std::span<const float> hidden) {
    follow(sequence, drafter, tokens, hidden);
  };
  std::optional<int32_t> next = generation.step(prefill(sequence, prompt, options.chunk, false, follow_chunk));
  while (next) {
    if (sequence.position() >= sequence.max_context()) {
      generation.stop(FinishReason::context_full);
      break;
    }
    const std::vector<int32_t> window =
        timed(counts.draft_seconds, [&] { return next_window(sequence, drafter, generation, *next, options); });
    const std::shared_ptr<const Checkpoint> before = window_checkpoint(sequence, window);
    StepRow row = verify_row(sequence, window, generation.greedy_only());
    timed(counts.verify_seconds, [&] { sequence.model().step(std::span(&row, 1)); });
    next = accept_window(sequence, drafter, generation, window, row, before.get(), counts);
  }
  GenerateResult result = generation.result();
  result.windows = counts.windows;
  result.drafted = counts.drafted;
  result.accepted = counts.accepted;
  result.draft_seconds = counts.draft_seconds;
  result.verify_seconds = counts.verify_seconds;
  result.follow_seconds = counts.follow_seconds;
  return result;
}

}  // namespace lode::engine
