// Routed experts computed on the host with the GPU's arithmetic (cpu/q8_twin.h): the CPU miss
// path's work for a decode step's absent experts (cuda/miss_path.h). For each (expert, row) pair:
// the row's x rounded for the gate (and up) weights, the gate and up products, their SwiGLU rounded
// for the down weights, the down product; each float bit-identical to what the CUDA decode step
// computes for the same expert and row. A step of several rows (a verify window, several
// sequences) sends an expert with every row that chose it. Buffers are allocated once; compute()
// allocates nothing.
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

  // `threads` in all, the calling thread included; a compute() of at most `most_pairs` (expert,
  // row) pairs (at least n_experts_used) over at most `most_rows` rows.
  HostExperts(const model::ModelWeights& weights, int threads, int most_pairs = 0, int most_rows = 1);

  // y [n][hidden] = experts[0, n) of `layer` applied to x [hidden]; n <= n_experts_used.
  void compute(int64_t layer, const int32_t* experts, int n, const float* x, float* y);
  // The pairs of experts[0, n) and their rows: expert i with each row r whose bit is set in
  // rows[i] (r < 64), x of row r at x + r hidden. Outputs in that order, expert after expert and
  // each expert's rows ascending, y [pairs][hidden].
  void compute(int64_t layer, const int32_t* experts, const uint64_t* rows, int n, const float* x, float* y);

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
  int64_t hidden_, ff_, most_pairs_, most_rows_;
  SpinPool pool_;
  // Per row: x rounded for the gate (and up, when its type differs) weights.
  std::vector<q8twin::RoundedBuffer> gate_x_, up_x_;
  std::vector<q8twin::RoundedBuffer> down_x_;  // per pair: its SwiGLU rounded for the down weights
  std::vector<float> gu_;                      // [pairs][gate ff | up ff]
  std::vector<int32_t> pair_expert_, pair_row_, used_rows_;  // a compute()'s pairs and rows
  std::vector<std::atomic<int>> row_ready_, gate_up_left_, down_ready_;  // per row and per pair of a compute()
};

}  // namespace lode::cpu
