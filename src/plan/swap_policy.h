// Adaptive expert placement, the policy half (the mechanism is cuda/expert_tier.h): decayed routing
// counts per (layer, expert), and between decode steps the hottest experts not in VRAM replacing
// the coldest resident ones, a few at a time, only where the difference is clear, so uniform
// routing's noise moves almost nothing while skewed routing settles its hot experts in VRAM. No
// CUDA here: tested on any machine.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace lode::plan {

struct SwapOptions {
  bool enabled = true;      // off: the placement stays as loaded (reproducible timings)
  int64_t every = 4;        // decode steps between rounds
  double decay = 0.98;      // what a round keeps of the scores before adding the new counts
  int64_t per_round = 16;   // swaps started at most per round
  // A hot expert replaces a cold one when hot >= ratio * cold + floor (decayed routings).
  double ratio = 2.0, floor = 16.0;
};

// Where an expert is, for choosing swaps: busy experts are on their way in or out.
enum class Residency : uint8_t { absent, resident, busy };

class SwapPolicy {
 public:
  SwapPolicy(int64_t n_experts_in_all, SwapOptions options);
  // Folds in the routing counts so far (cumulative since the start, [layer][expert]): each score
  // becomes score * decay + the routings since the last call.
  void observe(std::span<const uint64_t> counts);
  // Pairs (newcomer, victim), indices into [layer][expert]: the hottest absent experts against the
  // coldest resident ones, in order, while the rule holds, at most per_round.
  std::vector<std::pair<int64_t, int64_t>> choose(std::span<const Residency> where) const;
  const std::vector<double>& scores() const { return scores_; }
  const SwapOptions& options() const { return options_; }

 private:
  SwapOptions options_;
  std::vector<double> scores_;
  std::vector<uint64_t> last_;
};

}  // namespace lode::plan
