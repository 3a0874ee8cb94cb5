// The CPU miss path (DESIGN.md "The expert tier"): inside a decode step, once a layer's router has
// chosen, the dispatch kernel hands some of the absent experts to the host (plan/miss_split.h says
// how many) through a mailbox in mapped pinned memory, the GPU's kernels skip them and compute the
// rest (absent ones read over PCIe), and before the expert sum a gather kernel waits for the host's
// outputs and puts them in place. On the host a server thread answers each request with a pool of
// spinning threads (cpu/host_experts.h), whose products are the GPU's bit for bit, so the tokens
// do not depend on which side computed an expert. One host round trip per layer, and the step stays
// one CUDA graph.
//
// The host would sit idle while the GPU runs each layer's mixer, and its RAM with it. So as a
// layer's request goes out, a branch of the step routes h (after this layer's mixer) with the
// next layer's norm and router (on the 35B-A3B synth 89% of the experts it picks are the next
// layer's, on lode-mini 80%; the first layer's hint comes from the embedding) and hints the absent
// ones the CPU would take. Once it has answered, the host reads their bytes into its caches while
// the GPU finishes the layer and runs the next mixer, and the dispatch gives the CPU the hinted
// experts first. A hint changes where the host's reads come from, never what is computed. Host
// code; needs the CUDA runtime (the host's end itself, cuda/miss_server.h, does not).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu/host_experts.h"
#include "cuda/expert_kernels.h"
#include "cuda/miss_server.h"
#include "model/weights.h"
#include "plan/memory_plan.h"
#include "plan/miss_split.h"

namespace lode::cuda {

struct MissStats {
  double gpu_share_seconds = 0;  // the GPU's time from each request to its gather (its own share)
  double host_wait_seconds = 0;  // the gathers' wait for the host's answers after that
  uint64_t requests = 0;      // layers that sent the CPU work
  uint64_t experts = 0;       // experts the CPU computed
  uint64_t hinted_experts = 0;  // of them, those a hint had named (read ahead while the mixer ran)
  uint64_t expert_bytes = 0;  // their bytes (not read over PCIe)
  uint64_t token_pair_bytes = 0;  // those of one-token steps' requests (as the tier's routing counters count them)
  uint64_t read_ahead_bytes = 0;  // expert bytes read into the caches on hints
  double cpu_seconds = 0;     // the server's time computing them
};

class MissPath {
 public:
  // The decode scratch's kMissPathScratch bytes at `device_words` hold the kernels' device state.
  // Measures the costs (plan/miss_split.h) before it returns: the CPU on the model's own experts,
  // the GPU by the mapped-read probe.
  MissPath(const model::ModelWeights& weights, plan::MissPath path, void* device_words, void* stream);
  ~MissPath();
  MissPath(const MissPath&) = delete;
  MissPath& operator=(const MissPath&) = delete;

  const kernels::MissLink& link() const { return link_; }
  // After each decode step, its stream idle: fails clearly when the host did not answer a request
  // in time (once the host has answered the step's last request, the next step may use the
  // mailbox again); feeds the step's time (negative: none, a step of several rows) to the split
  // and uploads a changed table on `stream`.
  void after_step(double step_seconds, void* stream);
  MissStats stats() const;
  // One line for the run log: threads, measured costs, the split.
  std::string describe() const;
  static constexpr uint64_t kTimeoutNs = 20'000'000'000;  // a request unanswered this long fails the step

 private:
  void measure_costs();
  void upload_shares(void* stream);

  const model::ModelWeights& weights_;
  cpu::HostExperts host_;
  plan::MissCosts costs_;
  std::unique_ptr<plan::MissSplit> split_;
  double probe_gbps_ = 0;
  // k experts computed again (from the caches); k read ahead, then computed
  double cached_us_ = 0, read_ahead_us_ = 0, after_read_ahead_us_ = 0;
  kernels::MissMailbox* box_ = nullptr;  // pinned, mapped
  float *x_ = nullptr, *y_ = nullptr;    // host addresses of the mailbox's x and y
  int32_t* pinned_shares_ = nullptr;
  kernels::MissLink link_;
  std::unique_ptr<MissServer> server_;  // (started once the costs are measured)
};

}  // namespace lode::cuda
