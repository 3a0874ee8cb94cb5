// Speculative decoding with the model's MTP block (docs/MTP.md): the sequence's drafter proposes up
// to GenerateOptions::mtp tokens after the pending one; they run through the model in one step
// computed as decode steps are (StepRow::as_decode), and the step's logits are sampled in order by
// the same Generation while each sample equals the next draft. Every token is thus sampled from
// the logits a plain decode step gives, and the output is the output without drafts, greedy or
// sampled. A window that stops early is cut back to the tokens it keeps (Sequence::cut_window); a
// backend that cannot cut goes back to a checkpoint taken before it and runs them again.
// generate() runs it on one sequence; the server's worker runs the same pieces inside its batched
// steps (a window per decoding sequence, while at most WorkerOptions::mtp_sequences decode).
#pragma once

#include "engine/generate.h"
#include "engine/generation.h"

namespace lode::engine {

// generate() with options.mtp > 0. Fails, saying why, when the sequence cannot draft.
GenerateResult generate_with_drafts(Sequence& sequence, const tokenizer::Tokenizer& tokenizer,
                                    sample::Sampler& sampler, std::span<const int32_t> prompt,
                                    const GenerateOptions& options, const TextSink& on_text);

// The pieces, for a caller that batches windows of several sequences into one step.
//
// The drafter follows `tokens`, which the sequence has just taken (hidden: their final-normed
// states); a drafter that lost track of the sequence starts over from where these began.
void follow(const Sequence& sequence, Drafter& drafter, std::span<const int32_t> tokens,
            std::span<const float> hidden);

// The next window: `pending` and up to options.mtp drafts, as many as the context and the token
// limit leave room for.
std::vector<int32_t> next_window(const Sequence& sequence, Drafter& drafter, const Generation& generation,
                                 int32_t pending, const GenerateOptions& options);

// next_window for several sequences at once (of one model), their drafts asked of the model together
// (Model::draft_together): windows[i] is asks[i]'s.
struct WindowAsk {
  Sequence* sequence = nullptr;
  const Generation* generation = nullptr;
  int32_t pending = 0;
  const GenerateOptions* options = nullptr;
};
std::vector<std::vector<int32_t>> next_windows(std::span<const WindowAsk> asks);

// The step row that verifies a window (every position's logits and state, computed as decode
// steps). greedy_only (Generation::greedy_only): every position's greedy token instead of its
// logits (the GPU then copies 4 bytes a position, not the vocabulary's floats).
StepRow verify_row(Sequence& sequence, std::span<const int32_t> window, bool greedy_only);
// What accept_window goes back to when it stops early, taken before the verify step: a checkpoint,
// or nothing where there are no drafts or the sequence cuts windows itself (Sequence::cut_window).
std::shared_ptr<const Checkpoint> window_checkpoint(const Sequence& sequence, std::span<const int32_t> window);

struct WindowCounts {
  int64_t windows = 0, drafted = 0, accepted = 0;
  // Wall time in drafting (next_window), in the verify steps and in the drafter following the kept
  // tokens (accept_window), where the caller times them: on the GPU each ends waiting for its
  // stream, so they split a window's time between its parts.
  double draft_seconds = 0, verify_seconds = 0, follow_seconds = 0;
};

// After the verify step of `window` (row: its verify_row, run): samples in order while each
// sample equals the next draft, puts the sequence back to the tokens sampled from when it stopped
// early (cutting the window, or from `before`, window_checkpoint's) and has the drafter follow them.
// A greedy-only row stops too where the generation no longer takes greedy tokens (steering began):
// the last token sampled, a draft, is then the next pending one. Returns the next pending token, or
// nothing when generation ended.
std::optional<int32_t> accept_window(Sequence& sequence, Drafter& drafter, Generation& generation,
                                     std::span<const int32_t> window, const StepRow& row, const Checkpoint* before,
                                     WindowCounts& counts);

}  // namespace lode::engine
