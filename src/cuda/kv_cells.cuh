// Device access to paged K/V cells (cuda/kv_format.h), per format at compile time: no per-element
// branch in the attention kernels. Included by .cu files only.
#pragma once
#include <cuda_fp16.h>

#include "cuda/kv_format.h"

namespace lode::cuda {

template <KvFormat F>
struct KvCell;

template <>
struct KvCell<KvFormat::f32> {
  using Stored = float;
  __device__ static float load(const float* p) { return *p; }
  __device__ static void store(float* p, float v) { *p = v; }
};

template <>
struct KvCell<KvFormat::f16> {
  using Stored = __half;
  __device__ static float load(const __half* p) { return __half2float(*p); }
  __device__ static void store(__half* p, float v) { *p = __float2half_rn(v); }
};

// The row (row_values values) of position `pos` in a paged store.
template <KvFormat F>
__device__ __forceinline__ typename KvCell<F>::Stored* kv_row(void* store, const int32_t* pages, int64_t pos,
                                                              int64_t row_values) {
  const int64_t physical = int64_t(pages[pos / kKvPagePositions]) * kKvPagePositions + pos % kKvPagePositions;
  return static_cast<typename KvCell<F>::Stored*>(store) + physical * row_values;
}

}  // namespace lode::cuda
