#include "plan/miss_split.h"

#include <algorithm>

namespace lode::plan {

namespace {
constexpr double kTuneStep = 1.25;                    // the factor each try moves the CPU's weight by
constexpr double kMinWeight = 0.125, kMaxWeight = 8;  // beyond these the table no longer changes
}  // namespace

const char* to_string(MissPath path) {
  switch (path) {
    case MissPath::automatic: return "auto";
    case MissPath::gpu: return "gpu";
    case MissPath::cpu: return "cpu";
  }
  return "?";
}

MissSplit::MissSplit(MissPath path, int k, MissCosts costs, int most)
    : path_(path), k_(k), most_(std::max(k, most)), costs_(costs), shares_(table(1.0)) {}

// For each m, the CPU's share that finishes the layer's misses soonest: the slower of the CPU's
// request (if it has any) and the GPU's reads of the rest, the CPU's cost times `weight`.
std::vector<int32_t> MissSplit::table(double weight, int up_to) const {
  std::vector<int32_t> shares(size_t((up_to < 0 ? most_ : up_to) + 1), 0);
  for (int m = 0; m < int(shares.size()); ++m) {
    if (path_ == MissPath::cpu) shares[size_t(m)] = m;
    if (path_ != MissPath::automatic) continue;
    double best = -1;
    for (int c = 0; c <= m; ++c) {
      const double cpu = c ? weight * (costs_.cpu_request_us + c * costs_.cpu_expert_us) : 0.0;
      const double time = std::max(cpu, (m - c) * costs_.gpu_expert_us);
      if (best < 0 || time < best) best = time, shares[size_t(m)] = c;
    }
  }
  return shares;
}

// The next weight from the accepted one in direction_ (then the other way) that changes the table
// where one-token steps read it (m <= k: the steps whose times the trial measures); none: stay at
// the accepted weight. The search looks at those entries alone (a whole table for the hundreds of
// absent experts a step of many rows may have costs about a tenth of a millisecond), then makes
// the chosen weight's whole table.
void MissSplit::start_trial() {
  const std::vector<int32_t> accepted = table(accepted_, k_);
  for (int turn = 0; turn < 2; ++turn, direction_ = -direction_) {
    for (double w = accepted_;;) {
      w = std::clamp(direction_ > 0 ? w * kTuneStep : w / kTuneStep, kMinWeight, kMaxWeight);
      if (table(w, k_) != accepted) {
        weight_ = w, shares_ = table(w), trying_ = true;
        return;
      }
      if (w == kMinWeight || w == kMaxWeight) break;
    }
  }
  weight_ = accepted_, shares_ = table(accepted_), trying_ = false;
}

bool MissSplit::observe_step(double seconds) {
  if (path_ != MissPath::automatic) return false;
  window_sum_ += seconds;
  if (++steps_ < kWindow) return false;
  const double mean = window_sum_ / steps_;
  steps_ = 0, window_sum_ = 0;
  const std::vector<int32_t> before = shares_;
  if (!trying_) {
    best_ = mean;  // the accepted weight's time, fresh: now a trial against it
    start_trial();
  } else if (mean <= best_) {
    accepted_ = weight_, best_ = mean;  // the trial won: on in the same direction
    start_trial();
  } else {
    direction_ = -direction_;  // lost: back to the accepted weight, measured again before the next trial
    weight_ = accepted_, shares_ = table(accepted_), trying_ = false;
  }
  return shares_ != before;
}

}  // namespace lode::plan
