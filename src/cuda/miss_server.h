// The host's end of the CPU miss path (cuda/miss_path.h): a thread that answers each request a
// decode step's dispatch kernel posts in the mailbox (kernels::MissMailbox: the layer, the experts
// the CPU computes and their rows, the rows' MoE inputs x) with the (expert, row) pairs' outputs in
// y and the request's number in `done`, and between requests reads into its caches the experts a hint names. Host code on plain
// memory, no CUDA calls: MissPath gives it the mailbox mapped into the device, tests memory of
// their own.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "cpu/host_experts.h"
#include "cuda/expert_kernels.h"
#include "model/weights.h"
#include "plan/memory_plan.h"

namespace lode::cuda {

// What the server did so far.
struct MissServerCounts {
  uint64_t requests = 0;          // requests answered
  uint64_t experts = 0;           // experts computed
  uint64_t pairs = 0;             // (expert, row) pairs computed (an expert with each row that chose it)
  uint64_t hinted_experts = 0;    // of them, those a hint had named (read ahead while the mixer ran)
  uint64_t expert_bytes = 0;      // their bytes
  uint64_t pair_bytes = 0;        // an expert's bytes for each of its pairs (the routings the CPU took, in bytes)
  uint64_t token_pair_bytes = 0;  // of them, those of one-token steps' requests (MissMailbox::grouped 0)
  uint64_t read_ahead_bytes = 0;  // expert bytes read into the caches on hints
  double cpu_seconds = 0;         // time computing them
};

class MissServer {
 public:
  // Starts the thread. `host` computes the experts (HostExperts made for kMaxMissPairs pairs over
  // kMaxMissRows rows); x [kMaxMissRows][hidden] and y [kMaxMissPairs][hidden] are the mailbox's. All must outlive the server.
  MissServer(const model::ModelWeights& weights, cpu::HostExperts& host, kernels::MissMailbox& box, const float* x,
             float* y);
  ~MissServer();  // stops the thread
  MissServer(const MissServer&) = delete;
  MissServer& operator=(const MissServer&) = delete;

  // Waits at most `timeout` until the last request posted has been answered (`done` equal to
  // `request`); whether it has. After a request that a step stopped waiting for, the mailbox is in
  // step again once this holds.
  bool caught_up(std::chrono::nanoseconds timeout) const;
  MissServerCounts counts() const;

 private:
  void serve();
  void answer(uint32_t number, int32_t* experts);
  template <class Stop>
  void read_ahead(int32_t* experts, Stop&& stop);

  std::vector<plan::ExpertBytes> bytes_;  // per layer
  cpu::HostExperts& host_;
  kernels::MissMailbox& box_;
  const float* x_;
  float* y_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> requests_{0}, experts_{0}, pairs_{0}, hinted_experts_{0}, expert_bytes_{0}, pair_bytes_{0},
      token_pair_bytes_{0};
  std::atomic<uint64_t> read_ahead_bytes_{0}, cpu_ns_{0};
  int64_t answered_layer_ = -1;  // the last request's layer (the server thread's)
  std::thread thread_;           // (last: started once the rest is set)
};

}  // namespace lode::cuda
