// cp.async: copies from global to shared memory that bypass the registers, so a kernel can have the
// next tile's bytes in flight while it computes on the current one. Included by .cu files only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace lode::cuda {
namespace {

// kBytes (4, 8 or 16) from global to shared memory; zeros where !valid (global must still be a
// mapped address). 16-byte copies bypass L1 (.cg); the smaller ones may not. kOnce: bytes a decode
// step reads once (its weights, the K/V cells), whose L2 lines are then evicted first, before the
// lines the step reads again or asked L2 for ahead (on the H200, the 35B synth at depth 131,072:
// 1.7-2.7% faster in every K/V format measured; unchanged at depth 0).
template <int kBytes, bool kOnce = false>
__device__ __forceinline__ void copy_async(void* shared, const void* global, bool valid) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  const unsigned at = unsigned(__cvta_generic_to_shared(shared));
  if constexpr (kOnce) {
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    if constexpr (kBytes == 16)
      asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(at), "l"(global),
                   "r"(valid ? 16 : 0), "l"(policy));
    else
      asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], %2, %3, %4;\n" ::"r"(at), "l"(global),
                   "n"(kBytes), "r"(valid ? kBytes : 0), "l"(policy));
  } else if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(global), "r"(valid ? 16 : 0));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(at), "l"(global), "n"(kBytes),
                 "r"(valid ? kBytes : 0));
  }
}
__device__ __forceinline__ void copy_16(void* shared, const void* global, bool valid) {
  copy_async<16>(shared, global, valid);
}
__device__ __forceinline__ void copy_8(void* shared, const void* global, bool valid) {
  copy_async<8>(shared, global, valid);
}
// Closes the group of copies issued since the last call.
__device__ __forceinline__ void copies_sent() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits for every copy this thread issued.
__device__ __forceinline__ void copies_arrived() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Waits until at most kPending of this thread's newest groups are still in flight.
template <int kPending>
__device__ __forceinline__ void copies_arrived_but() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace
}  // namespace lode::cuda
