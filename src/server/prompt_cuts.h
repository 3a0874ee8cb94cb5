// Where the server cuts a prompt into the pieces the engine reads, and which cuts keep a prefix
// checkpoint (server/prefix_cache.h). A piece's bits depend on where it starts and ends, so a prompt
// resumed from a checkpoint must be cut where a cold run cuts it: the cuts are a function of the
// prompt's tokens alone, and a checkpoint is reused only where it sits on a cut of the new prompt
// (then every cut before it is the new prompt's too: PromptCuts::is_cut's comment says why).
//
// The cuts: every multiple of `step`, and the start of a chat turn (the template's turn-start
// token, <|im_start|>) that lies at least kTurnMin tokens past the cut before it, before the next
// multiple of `step` and before the prompt's end. Where a step is long (1,024 tokens on the GPU),
// the end of a shared system prompt and the turns of a conversation so still get checkpoints, and
// a request that shares only those reads the rest; no piece is shorter than kTurnMin for it, but
// the prompt's last one.
#pragma once

#include <cstdint>
#include <span>

namespace lode::server {

struct PromptCuts {
  static constexpr int64_t kTurnMin = 64;

  int64_t step = 64;              // the most tokens a piece holds; multiples of it are cuts
  int64_t checkpoint_every = 64;  // those at multiples of this (of step) keep a checkpoint; turn cuts all do
  int32_t turn_start = -1;        // the turn-start token's id; -1: cut at turns never

  // The end of the piece that starts at `from` (a cut, or 0).
  int64_t next(std::span<const int32_t> prompt, int64_t from) const;
  // Whether the cut at `at`, not the prompt's end, keeps a checkpoint.
  bool keeps_checkpoint(int64_t at) const { return at % checkpoint_every == 0 || at % step != 0; }
  // Whether a cold run of `prompt` cuts it at `at` (0 < at < its size).
  bool is_cut(std::span<const int32_t> prompt, int64_t at) const;
};

}  // namespace lode::server
