// Routed experts computed on the host with the GPU's arithmetic (cpu/q8_twin.h): the CPU miss
// path's work for a decode step's absent experts (cuda/miss_path.h). For one token: x rounded for
// the gate (and up) weights, the gate and up products, their SwiGLU rounded for the down weights,
// the down product; each float bit-identical to what the CUDA decode step computes for the same
// expert. Buffers are allocated once; compute() allocates nothing.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/q8_twin.h"
#include "cpu/spin_pool.h"
#include "model/weights.h"

namespace lode::cpu {

class HostExperts {
 public:
  // Why the model's experts cannot be computed this way ("" when they can): a type without a
  // twin of its GPU kernel.
  static std::string unsupported(const model::ModelWeights& weights);

  // `threads` in all, the calling thread included.
  HostExperts(const model::ModelWeights& weights, int threads);

  // y [n][hidden] = experts[0, n) of `layer` applied to x [hidden]; n <= n_experts_used.
  void compute(int64_t layer, const int32_t* experts, int n, const float* x, float* y);

  // Reads the bytes of experts[0, n) of `layer` (gate, up and down) into the caches, in pieces
  // spread over the pool, so that a compute() of them soon after reads the caches instead of RAM.
  // Stops taking pieces once stop() is true (what is left is read by compute() itself). Returns
  // the bytes it read.
  template <class Stop>
  int64_t prefetch(int64_t layer, const int32_t* experts, int n, Stop&& stop) {
    const PrefetchLayout layout = prefetch_layout(layer, n);
    std::atomic<int64_t> bytes{0};
    pool_.run(layout.pieces, [&](int64_t t) {
      if (!stop()) bytes.fetch_add(prefetch_piece(layout, experts, t), std::memory_order_relaxed);
    });
    return bytes.load();
  }
  int threads() const { return pool_.threads(); }

 private:
  struct PrefetchLayout {
    int64_t layer = 0, gate_pieces = 0, up_pieces = 0, down_pieces = 0, pieces = 0;
  };
  PrefetchLayout prefetch_layout(int64_t layer, int n) const;
  int64_t prefetch_piece(const PrefetchLayout& layout, const int32_t* experts, int64_t piece) const;  // its bytes
  const model::ModelWeights& weights_;
  int64_t hidden_, ff_, max_experts_;
  SpinPool pool_;
  q8twin::RoundedBuffer gate_x_, up_x_;   // x rounded for the gate (and up, when its type differs)
  std::vector<q8twin::RoundedBuffer> down_x_;  // per expert: its SwiGLU rounded for the down weights
  std::vector<float> gu_;                 // [n][gate ff | up ff]
  std::vector<std::atomic<int>> gate_up_left_, down_ready_;  // per expert of a compute()
};

}  // namespace lode::cpu
