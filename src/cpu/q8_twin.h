// The host twin of the CUDA decode's 8-bit-activation matrix products (cuda/matvec_q8_kernels.cu):
// the same rounding of x, the same integer dot products and every float step in the same order,
// so a product computed here has the GPU's bits. The CPU miss path (cpu/expert_worker.h) computes
// absent experts with it; the tokens cannot depend on which side computed an expert.
//
// The GPU kernel, and so the twin: a row is cut into slices (8 values of a Q8_0 / Q5_0 block, 32
// of a K-quant super-block); `lanes` = the largest power of two <= min(32, slices); lane i sums
// slices i, i + lanes, ... in order from 0.0f, then the lanes' sums meet in a butterfly (lane i
// adds lane i + o for o = lanes / 2 .. 1). Q8_0 rows of a multiple of 256 values (up to 64 times:
// quant::q8_0_in_spans) are cut into spans of 8 blocks instead, each span's block terms summed
// from 0 in order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/quant/types.h"

namespace lode::cpu::q8twin {

// Whether the GPU has a q8 kernel for `type`, and so the twin: Q8_0, Q5_0, Q4_K, Q5_K, Q6_K.
bool has_twin(GgmlType type);

// x rounded as the GPU rounds it for weights of one type: q [cols] int8; d [cols / 32] the scale
// of each 32 values (a Q8_K block's scale repeated 8 times); sum16 [cols / 16] the sum of each 16 q.
struct RoundedX {
  int8_t* q = nullptr;
  float* d = nullptr;
  int32_t* sum16 = nullptr;
};

// Memory for a RoundedX of `cols` values (each array 64-byte aligned), allocated once. Moves keep
// the memory (and so x()); copies would not, and are deleted.
class RoundedBuffer {
 public:
  explicit RoundedBuffer(int64_t cols);
  RoundedBuffer(const RoundedBuffer&) = delete;
  RoundedBuffer& operator=(const RoundedBuffer&) = delete;
  RoundedBuffer(RoundedBuffer&&) noexcept = default;
  RoundedBuffer& operator=(RoundedBuffer&&) noexcept = default;
  const RoundedX& x() const { return x_; }

 private:
  std::vector<uint8_t> memory_;
  RoundedX x_;
};

// Rounds x [cols] for weights of `type` (Q8_0 and Q5_0: blocks of 32, fp16 scale; the K-quants:
// blocks of 256, float scale). up non-null: the values are exact::swiglu(x[c], up[c]) instead.
void round(GgmlType type, const float* x, const float* up, int64_t cols, RoundedX out);

// One row of `cols` values stored as `type` dotted with rounded x, by the GPU's arithmetic written
// out plainly (the reference the fast kernels are tested against).
float row_dot(GgmlType type, const uint8_t* row, int64_t cols, const RoundedX& x);

// y[r] = row r of the matrix at w (row_bytes apart) dotted with x, for r in [0, rows): the fast
// kernels where the host has them (AVX2), row_dot elsewhere; the same bits either way.
void rows(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols, const RoundedX& x, float* y);

// Which kernel rows() uses for `type` on this host ("avx2", or "reference").
const char* kernel_name(GgmlType type);

}  // namespace lode::cpu::q8twin
