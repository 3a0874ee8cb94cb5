// Speculative decoding with the model's MTP block (docs/MTP.md): the sequence's drafter proposes up
// to GenerateOptions::mtp tokens after the pending one; they run through the model in one step
// computed as decode steps are (StepRow::as_decode), and the step's logits are sampled in order by
// the same Generation while each sample equals the next draft. Every token is thus sampled from
// the logits a plain decode step gives, and the output is the output without drafts, greedy or
// sampled. A window that stops early goes back to its checkpoint and runs the tokens it keeps again.
#pragma once

#include "engine/generate.h"

namespace lode::engine {

// generate() with options.mtp > 0. Fails, saying why, when the sequence cannot draft.
GenerateResult generate_with_drafts(Sequence& sequence, const tokenizer::Tokenizer& tokenizer,
                                    sample::Sampler& sampler, std::span<const int32_t> prompt,
                                    const GenerateOptions& options, const TextSink& on_text);

}  // namespace lode::engine
