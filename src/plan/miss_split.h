// How the CPU miss path (cuda/miss_path.h) splits a decode step's absent experts: per layer, of
// the m routed experts that are not in VRAM, share[m] are computed by the CPU and the rest read
// over PCIe by the GPU, both at once; the layer waits for the slower side. The table starts from
// costs measured when the session starts (the CPU's microseconds per request and per expert, the
// GPU's per expert at the measured PCIe rate) and, with --miss-path auto, follows the measured
// step times: every window of steps it tries the CPU's cost a step higher or lower and keeps what
// decodes faster. No CUDA here; tested on the CPU.
#pragma once
#include <cstdint>
#include <vector>

namespace lode::plan {

enum class MissPath { automatic, gpu, cpu };
const char* to_string(MissPath path);

struct MissCosts {
  double cpu_request_us = 0;    // a request's fixed cost: the round trip and three parallel loops
  double cpu_expert_us = 0;     // and each expert it computes
  double gpu_expert_us = 0;     // one absent expert read over PCIe by the GPU's kernels
};

class MissSplit {
 public:
  // k: experts routed per token; most: the most absent experts a layer of a step may have (a step
  // of several rows has up to k a row; at least k). MissPath::cpu gives the CPU every absent
  // expert; automatic splits by the costs and tunes; gpu gives the CPU none.
  MissSplit(MissPath path, int k, MissCosts costs, int most = 0);
  // [most + 1]: of m absent experts, how many the CPU computes.
  const std::vector<int32_t>& shares() const { return shares_; }
  // A decode step's wall time; true when the table changed (the session uploads it).
  bool observe_step(double seconds);
  // The CPU's cost as the tuning currently weighs it (1: as measured).
  double cpu_weight() const { return weight_; }
  static constexpr int kWindow = 16;  // steps per measurement

 private:
  // Shares for m = 0 .. up_to (default: most_).
  std::vector<int32_t> table(double weight, int up_to = -1) const;
  void start_trial();
  MissPath path_;
  int k_, most_;
  MissCosts costs_;
  // The tuning alternates windows: one at the accepted weight (refreshing its time), then trials of
  // a weight one step away (the first that changes the table), in `direction_` while they win.
  double accepted_ = 1.0, weight_ = 1.0;
  int direction_ = -1;
  bool trying_ = false;
  int steps_ = 0;
  double window_sum_ = 0, best_ = 0;
  std::vector<int32_t> shares_;
};

}  // namespace lode::plan
