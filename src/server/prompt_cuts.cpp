#include "server/prompt_cuts.h"

#include <algorithm>

namespace lode::server {

int64_t PromptCuts::next(std::span<const int32_t> prompt, int64_t from) const {
  const int64_t size = int64_t(prompt.size()), grid = (from / step + 1) * step;
  if (turn_start >= 0)
    for (int64_t t = from + kTurnMin, last = std::min(grid, size) - kTurnMin; t <= last; ++t)
      if (prompt[size_t(t)] == turn_start) return t;
  return std::min(grid, size);
}

// Walks the cold run's cuts. Why a checkpoint taken at cut `at` of another prompt, which has the
// same tokens before `at`, may then be reused: each cut is decided by the tokens before it, the cut
// before it and, for a turn cut, the prompt's end lying at least kTurnMin past it; but every turn
// cut before a cut `at` lies at least kTurnMin before `at` (the next turn cut, or the multiple of
// step it keeps its distance from), so the end of a prompt that runs past `at` decides none of them,
// and both prompts' cuts up to `at` are the same.
bool PromptCuts::is_cut(std::span<const int32_t> prompt, int64_t at) const {
  if (at <= 0 || at >= int64_t(prompt.size())) return false;
  if (at % step == 0) return true;  // (every cut's next goes no further than the multiple after it)
  if (turn_start < 0) return false;
  int64_t cut = 0;
  while (cut < at) cut = next(prompt, cut);
  return cut == at;
}

}  // namespace lode::server
