// The floor of a chain of dependent kernels (docs/PERFORMANCE.md, "The floor of a chain of dependent
// kernels"): a CUDA graph of 200 kernels, each reading its own S bytes with 16-byte loads (every
// thread's loads issued at once; the buffers together 400 MB, so L2 holds none of them) and a
// vector the kernel before it wrote, reducing each warp's dot products and writing them for the
// next. What one product of a decode step could cost at best, launch and dependency included.
// Four launch modes: plain graph edges; programmatic dependent launch (sm_90) with the loads after
// the wait, L2-prefetched before it, or in registers before it; and two that add what a decode
// product does besides streaming: "x rounded" (registers before the wait, then every block rounds
// 2048 floats of the vector to int8 in shared memory, a max per 32 values, before its dot
// products), "slot read" (an expert product: the buffer's slot in a table is read from what the
// kernel before wrote, after the wait, then the loads). Prints microseconds per kernel.
//
//   build/bench_cuda_chain
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

enum Mode { kPlain, kLoadsAfterWait, kPrefetchedBeforeWait, kLoadedBeforeWait, kRoundsX, kSlotRead, kModes };
constexpr const char* kModeNames[kModes] = {"plain", "after wait", "L2 before", "regs before", "x rounded",
                                            "slot read"};
constexpr int kRoundedX = 2048;  // values of the vector each block rounds in kRoundsX
constexpr int kThreads = 256, kChain = 200, kRepeats = 10;
constexpr int64_t kAllBuffers = int64_t(400) << 20;
constexpr int kVectorFloats = 1 << 20;  // each kernel's output; the next reads its first 512 words

__device__ __forceinline__ void wait_for_inputs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// x rounded to int8 in blocks of 32 values (one scale each, as decode's products round their
// input): thread i takes values 8i .. 8i + 7; four threads share a block's maximum.
__device__ void round_x(const float* x, int8_t* q) {
  float v[8], amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    v[j] = x[8 * threadIdx.x + j];
    amax = fmaxf(amax, fabsf(v[j]));
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  const float scale = amax > 0.0f ? 127.0f / amax : 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) q[8 * threadIdx.x + j] = int8_t(__float2int_rn(v[j] * scale));
  __syncthreads();
}

// Thread t reads words t, t + T, ... (T: the grid's threads), kLoads of them, of w (kSlotRead: of
// table[*slot_in], and block 0 writes the next slot to slot_out).
template <int kLoads, Mode kMode>
__global__ void __launch_bounds__(kThreads)
    stream_kernel(const uint4* w, uint4* const* table, int n_table, const int* slot_in, int* slot_out, int64_t words,
                  const int* x, float* y) {
  static_assert(kThreads * 8 == kRoundedX, "round_x: 8 values a thread");
  __shared__ int4 rounded[kRoundedX / 16];
  const int64_t all = int64_t(gridDim.x) * blockDim.x, t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  uint4 v[kLoads];
  const auto load = [&] {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) v[i] = t + i * all < words ? __ldg(w + t + i * all) : uint4{};
  };
  const bool before = kMode == kLoadedBeforeWait || kMode == kRoundsX;
  if (before) load();
  if (kMode == kPrefetchedBeforeWait && threadIdx.x % 8 == 0)  // one 128-byte line per 8 threads
#pragma unroll
    for (int i = 0; i < kLoads; ++i)
      if (t + i * all < words) asm volatile("prefetch.global.L2 [%0];" ::"l"(w + t + i * all));
  if (kMode != kPlain) wait_for_inputs();
  if (kMode == kSlotRead) {
    const int slot = *slot_in;
    w = table[slot];
    if (t == 0) *slot_out = (slot + 1) % n_table;
  }
  if (!before) load();
  const int4* xv = reinterpret_cast<const int4*>(x);
  if (kMode == kRoundsX) {
    round_x(reinterpret_cast<const float*>(x), reinterpret_cast<int8_t*>(rounded));
    xv = rounded;
  }
  int acc = 0;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int4 xw = xv[(t + i * all) % 128];
    acc = __dp4a(int(v[i].x), xw.x, acc);
    acc = __dp4a(int(v[i].y), xw.y, acc);
    acc = __dp4a(int(v[i].z), xw.z, acc);
    acc = __dp4a(int(v[i].w), xw.w, acc);
  }
  float s = float(acc);
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) y[t / 32] = s * 1e-30f;  // small: the next kernel's x stays finite
}

bool ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) std::fprintf(stderr, "bench_cuda_chain: %s: %s\n", what, cudaGetErrorString(err));
  return err == cudaSuccess;
}

// Microseconds per kernel of the chain over `buffers` (negative on an error).
// The buffers, their table on the device (kSlotRead) and the slot each kernel writes for the next.
struct Buffers {
  std::vector<uint4*> host;
  uint4** table = nullptr;
  int* slots = nullptr;  // [2]
};

template <int kLoads, Mode kMode>
double time_chain(const Buffers& buffers, int64_t bytes, float* vectors, cudaStream_t stream) {
  const int64_t words = bytes / 16;
  const unsigned blocks = unsigned((words + int64_t(kThreads) * kLoads - 1) / (int64_t(kThreads) * kLoads));
  cudaGraph_t graph = nullptr;
  if (!ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture")) return -1;
  for (int k = 0; k < kChain; ++k) {
    cudaLaunchAttribute overlap{};
    overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(kThreads);
    config.stream = stream;
    config.attrs = &overlap;
    config.numAttrs = kMode == kPlain ? 0 : 1;
    const int* x = reinterpret_cast<const int*>(vectors + (k % 2) * kVectorFloats);
    float* y = vectors + ((k + 1) % 2) * kVectorFloats;
    const uint4* w = buffers.host[size_t(k) % buffers.host.size()];
    const int* slot_in = buffers.slots + k % 2;
    int* slot_out = buffers.slots + (k + 1) % 2;
    if (!ok(cudaLaunchKernelEx(&config, stream_kernel<kLoads, kMode>, w, buffers.table, int(buffers.host.size()),
                               slot_in, slot_out, words, x, y),
            "launch"))
      return -1;
  }
  if (!ok(cudaStreamEndCapture(stream, &graph), "capture")) return -1;
  cudaGraphExec_t exec = nullptr;
  if (!ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate")) return -1;
  cudaGraphDestroy(graph);
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) cudaGraphLaunch(exec, stream);  // warm-up
  cudaEventRecord(start, stream);
  for (int i = 0; i < kRepeats; ++i) cudaGraphLaunch(exec, stream);
  cudaEventRecord(stop, stream);
  float ms = 0;
  const bool done = ok(cudaStreamSynchronize(stream), "running the chain");
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  return done ? 1e3 * ms / (kRepeats * kChain) : -1;
}

template <int kLoads>
void time_modes(const Buffers& buffers, int64_t bytes, float* vectors, cudaStream_t stream, double* us) {
  us[kPlain] = time_chain<kLoads, kPlain>(buffers, bytes, vectors, stream);
  us[kLoadsAfterWait] = time_chain<kLoads, kLoadsAfterWait>(buffers, bytes, vectors, stream);
  us[kPrefetchedBeforeWait] = time_chain<kLoads, kPrefetchedBeforeWait>(buffers, bytes, vectors, stream);
  us[kLoadedBeforeWait] = time_chain<kLoads, kLoadedBeforeWait>(buffers, bytes, vectors, stream);
  us[kRoundsX] = time_chain<kLoads, kRoundsX>(buffers, bytes, vectors, stream);
  us[kSlotRead] = time_chain<kLoads, kSlotRead>(buffers, bytes, vectors, stream);
}

}  // namespace

int main() {
  cudaStream_t stream = nullptr;
  float* vectors = nullptr;
  Buffers buffers;
  if (!ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream") ||
      !ok(cudaMalloc(&vectors, 2 * kVectorFloats * sizeof(float)), "allocating") ||
      !ok(cudaMemset(vectors, 0, 2 * kVectorFloats * sizeof(float)), "zeroing") ||
      !ok(cudaMalloc(&buffers.slots, 2 * sizeof(int)), "allocating") ||
      !ok(cudaMemset(buffers.slots, 0, 2 * sizeof(int)), "zeroing"))
    return 1;
  std::printf("us per kernel in a graph of %d dependent kernels (best of 1..16 loads a thread per mode)\n", kChain);
  std::printf("%9s", "MB");
  for (const char* name : kModeNames) std::printf(" %11s", name);
  std::printf(" %9s %12s\n", "best GB/s", "4.2 TB/s: us");
  for (const int64_t size : {int64_t(64) << 10, int64_t(2100000), int64_t(5800000), int64_t(9400000),
                             int64_t(26900000), int64_t(67000000)}) {
    const int64_t bytes = size / 16 * 16;
    buffers.host.assign(size_t(std::max<int64_t>(8, kAllBuffers / bytes)), nullptr);
    for (uint4*& b : buffers.host)
      if (!ok(cudaMalloc(&b, size_t(bytes)), "allocating") || !ok(cudaMemset(b, 1, size_t(bytes)), "filling")) return 1;
    // The slots restart at 0: the table of the size before may have been longer.
    if (!ok(cudaMemset(buffers.slots, 0, 2 * sizeof(int)), "zeroing")) return 1;
    const size_t table_bytes = buffers.host.size() * sizeof(uint4*);
    if (!ok(cudaMalloc(&buffers.table, table_bytes), "allocating") ||
        !ok(cudaMemcpy(buffers.table, buffers.host.data(), table_bytes, cudaMemcpyHostToDevice), "copying"))
      return 1;
    double us[5][kModes];
    time_modes<1>(buffers, bytes, vectors, stream, us[0]);
    time_modes<2>(buffers, bytes, vectors, stream, us[1]);
    time_modes<4>(buffers, bytes, vectors, stream, us[2]);
    time_modes<8>(buffers, bytes, vectors, stream, us[3]);
    time_modes<16>(buffers, bytes, vectors, stream, us[4]);
    double best[kModes], streaming = 1e30;  // streaming: the best of the first four modes
    for (int m = 0; m < kModes; ++m) {
      best[m] = 1e30;
      for (const auto& row : us) {
        if (row[m] < 0) return 1;
        best[m] = std::min(best[m], row[m]);
      }
      if (m <= kLoadedBeforeWait) streaming = std::min(streaming, best[m]);
    }
    std::printf("%9.2f", bytes / 1e6);
    for (double b : best) std::printf(" %11.2f", b);
    std::printf(" %9.0f %12.2f\n", bytes / 1e3 / streaming, bytes / 4.2e6);
    for (uint4* b : buffers.host) cudaFree(b);
    cudaFree(buffers.table);
  }
  return 0;
}
