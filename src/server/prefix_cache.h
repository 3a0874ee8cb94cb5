// Prefix reuse for the worker's session: it remembers the tokens the session holds and keeps
// checkpoints of the sequence every `interval` tokens, so that a request which shares a prefix
// with the previous conversation (an agent's next turn, a retry) starts from the last checkpoint
// inside the shared part instead of from nothing. Hybrid models cannot roll their DeltaNet state
// back, which is why the checkpoints exist (cpu::Session::checkpoint/rewind); K/V caches are just
// cut. Checkpoints sit at multiples of the prefill chunk, so a resumed prompt is split into exactly
// the chunks a cold run uses and gives bit-identical results.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "cpu/session.h"

namespace lode::server {

class PrefixCache {
 public:
  // interval: tokens between checkpoints (the prefill chunk); max_checkpoints bounds the memory
  // (each holds only the DeltaNet states; the oldest positions are dropped first).
  explicit PrefixCache(int64_t interval = 64, size_t max_checkpoints = 64);

  // Puts the session at the longest reusable prefix of `prompt` (rewound to a checkpoint, or reset
  // when there is none) and prefills the prompt up to its last whole interval, taking checkpoints.
  // Returns {cached, prefilled}: tokens reused from before, and where the rest of the prompt starts
  // (always before its last token, which generation needs to run for its logits).
  struct Start {
    int64_t cached = 0;
    int64_t prefilled = 0;
  };
  Start prepare(cpu::Session& session, std::span<const int32_t> prompt);

  // After generation: `generated` tokens were sampled; all but a pending last one are in the session.
  void record(std::span<const int32_t> generated, bool last_pending);
  // The session's contents are unknown (an error mid-way): reuse nothing next time.
  void clear();

  size_t checkpoints() const { return checkpoints_.size(); }
  int64_t bytes() const;

 private:
  void take_checkpoint(const cpu::Session& session);

  int64_t interval_;
  size_t max_checkpoints_;
  std::vector<int32_t> tokens_;  // what the session holds, in order
  std::map<int64_t, cpu::SequenceCheckpoint> checkpoints_;  // by position
};

}  // namespace lode::server
