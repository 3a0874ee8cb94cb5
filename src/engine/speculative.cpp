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

namespace {

// The drafts a window may hold: a window of n tokens yields at most n samples, no more than the
// context and the token limit hold; none where the drafter has not followed the sequence.
int64_t drafts_wanted(const Sequence& sequence, const Drafter& drafter, const Generation& generation,
                      const GenerateOptions& options) {
  const int64_t room = sequence.max_context() - sequence.position();
  const int64_t left = options.max_tokens - int64_t(generation.result().tokens.size());
  const int64_t n = std::max<int64_t>(std::min({options.mtp, room - 1, left - 1}), 0);
  return drafter.followed() == sequence.position() ? n : 0;
}

std::vector<int32_t> window_of(int32_t pending, std::span<const int32_t> drafts) {
  std::vector<int32_t> window = {pending};
  window.insert(window.end(), drafts.begin(), drafts.end());
  return window;
}

}  // namespace

std::vector<int32_t> next_window(const Sequence& sequence, Drafter& drafter, const Generation& generation,
                                 int32_t pending, const GenerateOptions& options) {
  const int64_t n = drafts_wanted(sequence, drafter, generation, options);
  return window_of(pending, n > 0 ? drafter.draft(pending, n, options.mtp_min_p) : std::vector<int32_t>{});
}

std::vector<std::vector<int32_t>> next_windows(std::span<const WindowAsk> asks) {
  if (asks.empty()) return {};
  std::vector<DraftAsk> drafts;
  for (const WindowAsk& a : asks) {
    Drafter& drafter = a.sequence->drafter();
    drafts.push_back({&drafter, a.pending, drafts_wanted(*a.sequence, drafter, *a.generation, *a.options),
                      a.options->mtp_min_p});
  }
  const std::vector<std::vector<int32_t>> drafted = asks.front().sequence->model().draft_together(drafts);
  std::vector<std::vector<int32_t>> windows;
  for (size_t i = 0; i < asks.size(); ++i) windows.push_back(window_of(asks[i].pending, drafted[i]));
  return windows;
}

StepRow verify_row(Sequence& sequence, std::span<const int32_t> window, bool greedy_only) {
  return {.sequence = &sequence, .tokens = window, .logit_rows = int64_t(window.size()), .want_hidden = true,
          .as_decode = true, .greedy_only = greedy_only};
}

std::shared_ptr<const Checkpoint> window_checkpoint(const Sequence& sequence, std::span<const int32_t> window) {
  return window.size() > 1 && !sequence.cuts_windows() ? sequence.checkpoint() : nullptr;
}

namespace {

// The sequence back to holding the first `kept` (at least 1) tokens of the window it just ran: the
// window cut, or where windows are not cut, rewound to before it and those tokens run again as the
// window ran them.
void keep_first(Sequence& sequence, std::span<const int32_t> window, size_t kept, const Checkpoint* before) {
  if (kept >= window.size()) return;
  if (sequence.cuts_windows()) return sequence.cut_window(int64_t(kept));
  sequence.rewind(*before);
  StepRow again{.sequence = &sequence, .tokens = window.first(kept), .logit_rows = 0, .as_decode = true};
  sequence.model().step(std::span(&again, 1));
}

}  // namespace

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
  } catch (...) {  // the text sink failed on window[used]'s sample: the sequence as a plain step
                   // leaves it there, holding window[0..used]
    keep_first(sequence, window, used + 1, before);
    throw;
  }
  ++counts.windows;
  counts.drafted += int64_t(window.size()) - 1;
  counts.accepted += int64_t(used) - 1;
  keep_first(sequence, window, used, before);  // back to the last token sampled from
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
  const double ready = ready_decode_steps(sequence, sampler, options);
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
  result.ready_seconds = ready;
  return result;
}

}  // namespace lode::engine
