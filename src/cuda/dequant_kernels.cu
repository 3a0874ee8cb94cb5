// The kernels behind cuda/dequant.h: one thread expands one 32-value unit of a row
// (cuda/expand_units.cuh) into 32 floats, written as eight 16-byte stores.
#include <cuda_runtime.h>

#include "cuda/dequant.h"
#include "cuda/expand_units.cuh"

namespace lode::cuda {

namespace {

using expand::Expand;

constexpr int kThreads = 256;

// Each thread expands one unit into its warp's shared staging area; the warp's 32 units are
// contiguous in `out`, so the warp then writes them out as 16-byte stores that cover whole lines.
constexpr int kStagedUnit = 36;  // floats per unit in shared memory: 16-byte aligned, fewer bank conflicts

template <GgmlType T>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t* w, const void* const* table, const int32_t* ids, int64_t rows, int64_t units,
                      size_t row_bytes, int64_t total_units, float* out) {
  __shared__ float4 staged[kThreads * kStagedUnit / 4];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  float4* mine = staged + threadIdx.x * (kStagedUnit / 4);
  if (i < total_units) {
    const int64_t u = i % units, r = (i / units) % rows, m = i / (units * rows);
    const int64_t id = ids ? int64_t(ids[m]) : m;
    // (Without a table, w's id-th matrix: with ids null, its m-th.)
    const uint8_t* matrix = id < 0  ? nullptr
                            : table ? static_cast<const uint8_t*>(table[id])
                                    : w + size_t(id) * rows * row_bytes;
    float v[32];
    if (id >= 0) Expand<T>::unit(matrix + r * row_bytes, u, v);
    else
      for (float& x : v) x = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) mine[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
  }
  __syncwarp();
  const int64_t warp_first = int64_t(blockIdx.x) * kThreads + warp * 32;
  const int64_t warp_units = min(int64_t(32), total_units - warp_first);
  if (warp_units <= 0) return;
  float4* o = reinterpret_cast<float4*>(out + warp_first * 32);
  const float4* from = staged + warp * 32 * (kStagedUnit / 4);
  for (int q = lane; q < warp_units * 8; q += 32) o[q] = from[(q / 8) * (kStagedUnit / 4) + q % 8];
}

template <GgmlType T>
cudaError_t launch(const void* w, const void* const* table, const int32_t* ids, int64_t n_matrices, int64_t rows,
                   int64_t cols, size_t row_bytes, float* out, cudaStream_t stream) {
  const int64_t units = cols / 32, total = n_matrices * rows * units;
  if (total == 0) return cudaSuccess;
  dequantize_kernel<T><<<unsigned((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(w), table, ids, rows, units, row_bytes, total, out);
  return cudaGetLastError();
}

}  // namespace

const char* dequantize(GgmlType type, const void* w, const void* const* table, const int32_t* ids, int64_t n_matrices,
                       int64_t rows, int64_t cols, size_t row_bytes, float* out, void* stream) {
  if (cols % 32 != 0) return "rows must be a multiple of 32 values";
  cudaError_t err = cudaSuccess;
  const bool known = for_weight_type<WeightKernel::expand>(type, [&](auto t) {
    err = launch<decltype(t)::value>(w, table, ids, n_matrices, rows, cols, row_bytes, out, static_cast<cudaStream_t>(stream));
  });
  if (!known) return "no dequantization kernel for this type";
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace lode::cuda
