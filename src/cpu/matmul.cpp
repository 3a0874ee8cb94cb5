#include "cpu/matmul.h"

#include <omp.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "core/error.h"
#include "cpu/activation_rounding.h"
#include "cpu/fast_rows.h"

namespace lode::cpu {

// Built for AVX2 and the baseline (picked at run time); no FMA, so the rounding is the same.
__attribute__((target_clones("avx2", "default")))
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) acc[i % 8] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

namespace {

void check_readable(const model::MatrixView& w) {
  if (w.type == nullptr || w.data == nullptr) fail("cpu matmul: weight matrix is not bound");
  if (w.type->type != GgmlType::F32 && w.type->dequantize == nullptr) {
    fail("cpu matmul: weights of type {} cannot be read by lode", w.type->name);
  }
}

// The float values of row r: the stored row itself for F32, else decoded into `buffer`.
const float* row_values(const model::MatrixView& w, DequantizeRow decode, int64_t r, float* buffer) {
  if (w.type->type == GgmlType::F32) return reinterpret_cast<const float*>(w.row(r));
  decode(w.row(r), buffer, w.cols);
  return buffer;
}

}  // namespace

// Unset: OpenMP's count (OMP_NUM_THREADS, else every core), at most 4 per hardware thread as
// --threads (OMP_NUM_THREADS=100000 crashed a run).
int Compute::resolved_threads() const {
  if (threads > 0) return threads;
  return std::min(omp_get_max_threads(), 4 * int(std::max(1u, std::thread::hardware_concurrency())));
}

namespace {

// X with every row rounded for W's type (Activations::q8), or X itself.
const float* activations_for(const model::MatrixView& w, const float* x, int64_t n_tokens,
                             const Compute& compute, std::vector<float>& rounded) {
  if (compute.activations == model::Activations::f32 || w.type->type == GgmlType::F32) return x;
  rounded.resize(size_t(n_tokens * w.cols));
  for (int64_t t = 0; t < n_tokens; ++t) {
    round_activations(w.type->type, x + t * w.cols, rounded.data() + t * w.cols, w.cols);
  }
  return rounded.data();
}

}  // namespace

void matmul(const model::MatrixView& w, const float* x_in, float* y, int64_t n_tokens, const Compute& compute) {
  check_readable(w);
  std::vector<float> rounded;
  const float* x = activations_for(w, x_in, n_tokens, compute, rounded);
  const int n_threads = compute.resolved_threads();
  // Small products are not worth waking the thread team for.
  const bool parallel = n_threads > 1 && w.rows * w.cols * n_tokens >= (1 << 15);
  const DequantizeRow decode = row_decoder(w.type->type);
#pragma omp parallel num_threads(n_threads) if (parallel)
  {
    std::vector<float> buffer(size_t(w.cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < w.rows; ++r) {
      const float* wr = row_values(w, decode, r, buffer.data());
      for (int64_t t = 0; t < n_tokens; ++t) {
        y[t * w.rows + r] = dot(wr, x + t * w.cols, w.cols);
      }
    }
  }
}


}  // namespace lode::cpu
