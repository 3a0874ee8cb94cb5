// Device helpers shared by the forward kernels (decode and prompt forms): warp and block sums,
// the activation functions, launch bookkeeping. Included by .cu files only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/exact_math.h"

namespace lode::cuda::kernels {
namespace {

constexpr int kWarp = 32;

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
inline const char* launched() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}
inline const char* error_text(cudaError_t err) { return err == cudaSuccess ? nullptr : cudaGetErrorString(err); }
inline unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

// Programmatic dependent launch (sm_90 and later): a kernel queued with launch_overlapped may be
// scheduled while the kernel before it on the stream still runs, so its launch and any weight
// prefetches overlap that kernel's tail. Such a kernel must call wait_for_inputs() before it reads
// anything an earlier kernel writes or writes anything an earlier kernel reads; let_next_start()
// then lets the kernel after it be scheduled in turn. Elsewhere both are no-ops.
__device__ __forceinline__ void wait_for_inputs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void let_next_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Both, for kernels with nothing to do before their inputs are ready.
__device__ __forceinline__ void begin_after_inputs() {
  wait_for_inputs();
  let_next_start();
}

// let_next_start() once `loaded`, a value computed from this kernel's reads after its wait, is
// known. For the one-block expert sum (residual and next norm) at the end of each layer: the mixer
// input product after it sends for all its weights before its own wait (the DeltaNet one 27 MB),
// and those loads, issued while the one block reads the experts' outputs from L2, queue ahead of
// them (a per-block clock of the wait's release put the expert sum at 9 us of a layer's 52). On
// the H200, the 35B synth, fp16 K/V: tg128 467.3 / 469.0 tokens/s against 464.6 / 463.6, depth
// 131,072 unchanged (348 against 347). The other one-block norms waiting too cost depth 131,072
// 1.4% (the router and the attention products after them then start late), and the DeltaNet conv
// and step kernels waiting as well were slower at depth 0 (460-462).
__device__ __forceinline__ void let_next_start_once(float loaded) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::"f"(loaded));
#endif
}

inline bool device_overlaps_launches() {
  static const bool overlaps = [] {
    int device = 0, major = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
  }();
  return overlaps;
}

// Whether this kernel's loaded code has wait_for_inputs' wait: code built for sm_90 or later (a
// newer GPU running code JIT-compiled from an older architecture's PTX has the wait compiled out).
inline bool kernel_waits_for_inputs(const void* kernel) {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess && attributes.ptxVersion >= 90;
}

// Lets `kernel` take `bytes` of dynamic shared memory: a kernel opts in to more than 48 KB.
template <class... Params>
cudaError_t allow_shared(void (*kernel)(Params...), size_t bytes) {
  return bytes > 48 * 1024 ? cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes))
                           : cudaSuccess;
}

// An attribute of the current device, or `fallback` where it cannot be read (read once a process:
// lode runs one kind of GPU).
inline int device_attribute(cudaDeviceAttr attribute, int fallback) {
  int device = 0, n = 0;
  cudaGetDevice(&device);
  return cudaDeviceGetAttribute(&n, attribute, device) == cudaSuccess && n > 0 ? n : fallback;
}

inline int multiprocessors() {
  static const int count = device_attribute(cudaDevAttrMultiProcessorCount, 132);
  return count;
}

// The most dynamic shared memory a block may take (opted in).
inline size_t max_shared_per_block() {
  static const size_t bytes = size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024));
  return bytes;
}

// kernel<<<grid, block, shared, stream>>>(args...), allowed to overlap the kernel before it (see
// wait_for_inputs) where the device and the kernel's code support it.
template <class... Params, class... Args>
cudaError_t launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, void* stream,
                              Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = as_stream(stream);
  config.attrs = &attribute;
  config.numAttrs = device_overlaps_launches() && kernel_waits_for_inputs(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A reduction over the block (blockDim.x a multiple of 32, at most 1024): warp_op within each warp,
// then over the warps' results (identity standing in for missing warps); every thread gets it.
template <class WarpOp>
__device__ float block_reduce(float v, WarpOp warp_op, float identity) {
  __shared__ float partial[32];
  __shared__ float total;
  v = warp_op(v);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < int(blockDim.x / kWarp) ? partial[lane] : identity;
    s = warp_op(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const float result = total;
  __syncthreads();  // partial/total may be reused by a later call
  return result;
}

// Whether this block is the last of `blocks` to get here, counted in *arrivals (device memory,
// zeroed): every block's writes before the call are visible to the last one after it, which
// resets the counter (for the next launch) when it is done with what the others wrote. A block
// that is not last returns at once from the kernel, as every caller does.
//
// The block's barrier orders its threads' writes before thread 0's count, whose release (gpu scope)
// carries them to the last block, whose count's acquire and barrier carry the others' writes to
// all its threads: one fence-like operation on the chain where a fence in every thread and a
// second one in the last block were two (a clock in the 35B's step on the H200: 1.1 us from the
// router's last logit to its last block's count, 1.3 with the fences).
__device__ __forceinline__ bool last_to_arrive(unsigned* arrivals, unsigned blocks) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(arrivals) : "memory");
    last = before == blocks - 1;
  }
  __syncthreads();
  return last;
}

__device__ float block_sum(float v) {
  return block_reduce(v, [](float x) { return warp_sum(x); }, 0.0f);
}

__device__ float block_max(float v) {
  return block_reduce(v, [](float x) { return warp_max(x); }, -INFINITY);
}

// v rounded to tf32 (10 stored mantissa bits, to nearest, ties away): what the tensor cores then
// read exactly (given a float they would drop the low bits instead).
__device__ __forceinline__ float tf32_rounded(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
  return __uint_as_float(r);
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf(float x) { return x * sigmoidf(x); }
__device__ __forceinline__ float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Asks L2 for the 128-byte lines of [p, p + bytes), this lane taking every lanes-th line: issued
// before a block's prologue (staging x), so the weights' DRAM latency overlaps it.
__device__ __forceinline__ void prefetch_lines(const void* p, int64_t bytes, int lane, int lanes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t at = int64_t(lane) * 128; at < bytes; at += int64_t(lanes) * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c + at));
}

// Input value c of a matrix product: x[c], or silu(x[c]) * x[swiglu_up + c] for a SwiGLU's halves
// (exact::swiglu, which the CPU miss path reproduces bit for bit).
__device__ __forceinline__ float input_value(const float* x, int64_t c, int64_t swiglu_up) {
  return swiglu_up ? exact::swiglu(x[c], x[swiglu_up + c]) : x[c];
}

}  // namespace
}  // namespace lode::cuda::kernels
