#include "cpu/matmul.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/host_isa.h"
#include "core/quant/blocks.h"
#include "cpu/activation_rounding.h"
#include "cpu/fast_rows.h"

namespace lode::cpu {

namespace {

// dot()'s final tree over its eight partial sums (every dot here ends with it).
inline float sum_lanes(const float acc[8]) {
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace

// Built for AVX2 and the baseline (picked at run time); no FMA, so the rounding is the same.
__attribute__((target_clones("avx2", "default")))
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) acc[i % 8] += a[i] * b[i];
  return sum_lanes(acc);
}

namespace {

// dot(a[r], b, n) for four rows at once, each in dot()'s order (lane j of its accumulator sums
// elements j, j + 8, ... in turn; the same tree at the end), so each gives dot()'s bits. One row's
// chain of dependent adds bounds dot(); four independent chains hide that latency (1.6x).
__attribute__((target("avx2"))) void dot4_avx2(const float* const a[4], const float* b, int64_t n, float out[4]) {
  __m256 c[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(b + i);
    for (int r = 0; r < 4; ++r) c[r] = _mm256_add_ps(c[r], _mm256_mul_ps(_mm256_loadu_ps(a[r] + i), x));
  }
  alignas(32) float acc[4][8];
  for (int r = 0; r < 4; ++r) _mm256_store_ps(acc[r], c[r]);
  for (int r = 0; r < 4; ++r) {
    for (int64_t k = 0; i + k < n; ++k) acc[r][k] += a[r][i + k] * b[i + k];  // (i is a multiple of 8)
    out[r] = sum_lanes(acc[r]);
  }
}

// dot4 of four q8_0 rows, decoded as they are read: each value is the decoder's float(code) times
// the block's scale (cpu/fast_rows_avx2.cpp), then dot4's adds in dot4's order, so each row gets
// dot(decoded row, b)'s bits without the decoded row going through memory. (q8_0 rows are whole
// blocks of 32: no tail.)
__attribute__((target("avx2,f16c"))) void dot4_q8_0_avx2(const void* const rows[4], const float* b, int64_t n,
                                                        float out[4]) {
  const auto* blocks = reinterpret_cast<const quant::BlockQ8_0* const*>(rows);
  __m256 c[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t k = 0; k < n / quant::QK8_0; ++k) {
    __m256 d[4];
    for (int r = 0; r < 4; ++r) d[r] = _mm256_set1_ps(fp16_to_fp32(blocks[r][k].d));
    for (int e = 0; e < quant::QK8_0; e += 8) {
      const __m256 x = _mm256_loadu_ps(b + k * quant::QK8_0 + e);
      for (int r = 0; r < 4; ++r) {
        const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blocks[r][k].qs + e));
        const __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), d[r]);
        c[r] = _mm256_add_ps(c[r], _mm256_mul_ps(w, x));
      }
    }
  }
  alignas(32) float acc[8];
  for (int r = 0; r < 4; ++r) {
    _mm256_store_ps(acc, c[r]);
    out[r] = sum_lanes(acc);
  }
}

}  // namespace

void dot4(const float* const a[4], const float* b, int64_t n, float out[4]) {
  if (host_has_avx2()) return dot4_avx2(a, b, n, out);
  for (int r = 0; r < 4; ++r) out[r] = dot(a[r], b, n);
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
  // One input (a decode step): q8_0 rows are dotted as they are decoded (the same bits).
  const bool fused_q8_0 = n_tokens == 1 && w.type->type == GgmlType::Q8_0 && host_has_avx2();
  // Rows in groups of four (dot4), each row's dot the same whatever its group or thread.
  const int64_t groups = (w.rows + 3) / 4;
#pragma omp parallel num_threads(n_threads) if (parallel)
  {
    std::vector<float> buffer(size_t(4 * w.cols));
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t first = 4 * g, count = std::min<int64_t>(4, w.rows - first);
      if (fused_q8_0 && count == 4) {
        const void* rows[4] = {w.row(first), w.row(first + 1), w.row(first + 2), w.row(first + 3)};
        dot4_q8_0_avx2(rows, x, w.cols, y + first);
        continue;
      }
      const float* wr[4];
      for (int64_t k = 0; k < count; ++k) wr[k] = row_values(w, decode, first + k, buffer.data() + k * w.cols);
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* xt = x + t * w.cols;
        float* yt = y + t * w.rows + first;
        if (count == 4) {
          dot4(wr, xt, w.cols, yt);
        } else {
          for (int64_t k = 0; k < count; ++k) yt[k] = dot(wr[k], xt, w.cols);
        }
      }
    }
  }
}


}  // namespace lode::cpu
