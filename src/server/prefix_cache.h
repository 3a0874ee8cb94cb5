// Prefix reuse for one sequence slot of the server: it remembers the tokens the slot's sequence
// holds and keeps checkpoints of the sequence at some of the cuts where its prompts were read
// (server/prompt_cuts.h), so that a request which shares a prefix with the slot's last conversation
// (an agent's next turn, a retry, a shared system prompt) starts from the last checkpoint inside the
// shared part instead of from nothing. Hybrid models cannot roll their DeltaNet state back, which is
// why the checkpoints exist (engine::Sequence::checkpoint/rewind); K/V caches are just cut. A
// checkpoint is reused only where it sits on a cut of the new prompt, so a resumed prompt is split
// into exactly the pieces a cold run reads and gives bit-identical results.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <unordered_set>
#include <vector>

#include "engine/engine.h"
#include "server/prompt_cuts.h"

namespace lode::server {

class PrefixCache {
 public:
  // cuts: where prompts are cut (the checkpoints' positions are cuts of it); max_checkpoints bounds
  // the memory: the lowest positions are dropped first, but for the lowest at a turn (a cut off
  // the step's multiples: the end of a system prompt, which other conversations share, or of a
  // first message), which stays while the bound leaves room for a newer one beside it. What a
  // checkpoint holds is the engine's: the CPU engine's the DeltaNet states, the GPU's its K/V pages
  // as well.
  explicit PrefixCache(PromptCuts cuts = {}, size_t max_checkpoints = 64);

  // How many of `prompt`'s tokens resume() would reuse on this sequence (a checkpoint's position,
  // always before the prompt's last token, which generation needs to run for its logits).
  // generating: the sequence is running a request, which moves it past what the cache holds (its
  // checkpoints can still be copied to another sequence); otherwise a sequence not where the cache
  // left it is not trusted.
  int64_t reusable(const engine::Sequence& sequence, std::span<const int32_t> prompt, bool generating = false) const;
  // Puts the sequence at that checkpoint (or resets it when there is none); returns its position.
  // The rest of the prompt is then prefilled by the caller in chunks, reported with after_chunk.
  int64_t resume(engine::Sequence& sequence, std::span<const int32_t> prompt);
  // Like resume(), but from another slot's cache: copies `source`'s longest reusable prefix of
  // `prompt` (from `source_sequence`) into `sequence`, leaving the source as it was.
  int64_t resume_from(engine::Sequence& sequence, const PrefixCache& source, const engine::Sequence& source_sequence,
                      std::span<const int32_t> prompt, bool source_generating = false);
  // `chunk` was just appended to the sequence; checkpoint: take a checkpoint after it (the caller
  // does so at the cuts that keep one, before the prompt's last piece).
  void after_chunk(const engine::Sequence& sequence, std::span<const int32_t> chunk, bool checkpoint);

  // After generation: `generated` tokens were sampled; all but a pending last one are in the sequence.
  void record(std::span<const int32_t> generated, bool last_pending);
  // The sequence's contents are unknown (an error mid-way): reuse nothing next time.
  void clear();
  // Lets go of the checkpoint at the lowest position (false when there is none): what the server
  // does when all slots' checkpoints hold more memory than it allows.
  bool drop_oldest();

  int64_t held() const { return int64_t(tokens_.size()); }  // tokens the sequence holds
  size_t checkpoints() const { return checkpoints_.size(); }
  // The host memory its checkpoints hold, each counted once however many caches hold it (a prefix
  // copied to another slot shares the source's checkpoints): those in `seen` are skipped, and its
  // own are added there.
  int64_t bytes(std::unordered_set<const engine::Checkpoint*>& seen) const;

 private:
  // The checkpoint resume() would use, or checkpoints_.end().
  std::map<int64_t, std::shared_ptr<const engine::Checkpoint>>::const_iterator usable(const engine::Sequence& sequence,
                                                                    std::span<const int32_t> prompt,
                                                                    bool generating) const;

  void bound();  // drops checkpoints past max_checkpoints_ (the constructor's comment says which)

  PromptCuts cuts_;
  size_t max_checkpoints_;
  std::vector<int32_t> tokens_;  // what the sequence holds, in order
  std::map<int64_t, std::shared_ptr<const engine::Checkpoint>> checkpoints_;  // by position
};

}  // namespace lode::server
