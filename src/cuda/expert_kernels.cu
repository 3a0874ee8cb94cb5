#include "cuda/expert_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/forward_kernels.h"
#include "cuda/kernel_math.cuh"

namespace lode::cuda::kernels {

namespace {

__global__ void set_experts_kernel(const void** tables, uint8_t* flags, int64_t n_experts, ExpertEntries entries) {
  const int i = threadIdx.x;
  if (i >= entries.count) return;
  const ExpertEntry& e = entries.at[i];
  const int64_t layer = e.index / n_experts, expert = e.index % n_experts;
  const void** table = tables + layer * 3 * n_experts;
  table[expert] = e.gate;
  table[n_experts + expert] = e.up;
  table[2 * n_experts + expert] = e.down;
  flags[e.index] = e.resident;
}

constexpr int kMissThreads = 256;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void miss_hint_kernel(MissLink link, const int32_t* predicted, int k, const uint8_t* resident, int layer) {
  const int lane = threadIdx.x;  // one warp; k <= kMaxMissTokenExperts
  const int32_t expert = lane < k ? predicted[lane] : 0;
  const bool absent = lane < k && !resident[expert];
  const unsigned absent_mask = __ballot_sync(0xffffffffu, absent), below = (1u << lane) - 1;
  const int count = link.share[__popc(absent_mask)];
  const bool hinted = absent && __popc(absent_mask & below) < count;
  int32_t* words = link.hinted + (layer % 2) * (1 + kMaxMissExperts);
  if (hinted) {
    const int i = __popc(absent_mask & below);
    words[1 + i] = expert;
    link.box->hint_expert[i] = expert;
  }
  // (The other lanes' writes ordered before lane 0's fence, and so before the number the host
  // waits on: a fence orders its own thread's writes and those it has synchronized with.)
  __syncwarp();
  if (lane != 0) return;
  words[0] = count;
  if (count == 0) return;
  link.box->hint_layer = layer;
  link.box->hint_count = count;
  __threadfence_system();  // the hint's contents reach the host before its number
  const uint32_t number = *link.hint_sequence + 1;
  *link.hint_sequence = number;
  *reinterpret_cast<volatile uint32_t*>(&link.box->hint) = number;
}

// The dispatch block's last step, once every thread has written its part of the request: the
// request's number, after its contents.
__device__ void post_request(const MissLink& link) {
  __threadfence_system();  // the request's contents reach the host before its number
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t number = *link.sequence + 1;
    *link.sequence = number;
    link.clock[0] = global_ns();
    *reinterpret_cast<volatile uint32_t*>(&link.box->request) = number;
  }
}

// The stage's entries for the j-th chosen expert (miss_dispatch's, without the CPU's).
__device__ void stage_entry(const MissStage& s, int j, int k, int32_t expert, bool resident, bool cpu,
                            const void* const* table, int n_experts) {
  s.ids[j] = cpu ? -1 : j;
  s.ids[k + j] = cpu ? -1 : k + j;
  s.table[j] = resident ? table[expert] : s.gate_up + j * s.gate_up_stride;
  s.table[k + j] = resident ? table[n_experts + expert] : s.gate_up + j * s.gate_up_stride + s.up_at;
  s.table[2 * k + j] = resident ? table[2 * n_experts + expert] : s.down + j * s.down_stride;
}

__global__ void __launch_bounds__(kMissThreads)
    miss_dispatch_kernel(MissLink link, int32_t* ids, int k, const uint8_t* resident, int layer, const float* x,
                         const void* const* table, int n_experts, MissStage stage) {
  __shared__ int count;
  if (threadIdx.x < 32) {  // warp 0 chooses; k <= kMaxMissTokenExperts
    const int lane = threadIdx.x;
    const int32_t expert = lane < k ? ids[lane] : 0;
    const bool absent = lane < k && !resident[expert];
    bool in_hint = false;
    const int32_t* hint = link.hinted + (layer % 2) * (1 + kMaxMissExperts);
    for (int j = 0, n = hint[0]; j < n; ++j) in_hint |= hint[1 + j] == expert;
    // The CPU takes its share of the absent experts, those it was told of first (it has read
    // their bytes already), then the others in routing order.
    const unsigned hinted_mask = __ballot_sync(0xffffffffu, absent && in_hint);
    const unsigned other_mask = __ballot_sync(0xffffffffu, absent && !in_hint), below = (1u << lane) - 1;
    const int cpu_count = link.share[__popc(hinted_mask | other_mask)];
    const int hinted = min(__popc(hinted_mask), cpu_count);
    const int rank = in_hint ? __popc(hinted_mask & below) : __popc(hinted_mask) + __popc(other_mask & below);
    const bool cpu = absent && rank < cpu_count;
    const bool staged = absent && !cpu;  // the GPU computes it from the stage
    const unsigned staged_mask = __ballot_sync(0xffffffffu, staged);
    if (stage.table) {
      if (lane < k) stage_entry(stage, lane, k, expert, !absent, cpu, table, n_experts);
      if (staged) stage.copies[1 + __popc(staged_mask & below)] = lane;
      if (lane == 0) stage.copies[0] = __popc(staged_mask);
    }
    if (cpu) {
      const int i = in_hint ? rank : hinted + __popc(other_mask & below);
      link.box->expert[i] = expert;
      link.box->rows[i] = 1;  // (the step's one row)
      link.pending[1 + i] = lane;
      ids[lane] = -1;
      ids[k + lane] = -1;
    }
    if (lane == 0) {
      count = min(cpu_count, __popc(hinted_mask | other_mask));
      link.pending[0] = count;
      link.box->layer = layer;
      link.box->count = count;
      link.box->hinted = hinted;
      link.box->grouped = 0;
    }
  }
  __syncthreads();
  if (count == 0) return;
  for (int c = threadIdx.x; c < link.hidden; c += blockDim.x) link.x[c] = x[c];
  post_request(link);
}

static_assert(kMaxMissShares == kMaxRoutedExperts, "the split table tells apart every count of absent experts");
static_assert(kMaxMissTokenExperts == kWarp && kMaxMissExperts < 128, "a lane a routed expert; taken[] holds 1 + a place");

// One block: each absent expert's rows (shared atomics over the pairs), then warp 0 chooses the
// CPU's experts, and the block writes where each pair's output goes, takes the chosen experts out of
// the groups, copies the rows they read into the mailbox and posts the request.
__global__ void __launch_bounds__(kMissThreads)
    miss_dispatch_rows_kernel(MissLink link, const int32_t* ids, int rows, int k, const uint8_t* resident, int layer,
                              const float* x, int n_experts, ExpertGroup* groups, int n_groups, unsigned* absent_groups) {
  __shared__ unsigned long long rows_of[kMaxRoutedExperts];  // absent expert e: bit r for each row r that chose it
  __shared__ int8_t taken[kMaxRoutedExperts];               // the CPU's expert e: 1 + its place in the request
  __shared__ int first_pair[kMaxMissExperts];                // the request's expert i: its first pair's place
  __shared__ int count;
  __shared__ unsigned long long read_rows;  // the rows the CPU's experts read
  __shared__ unsigned emptied;              // groups handed to the CPU
  const int pairs = rows * k;
  if (threadIdx.x == 0) emptied = 0;
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) rows_of[e] = 0, taken[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int32_t e = ids[p];
    if (unsigned(e) < unsigned(n_experts) && !resident[e]) atomicOr(&rows_of[e], 1ull << (p / k));
  }
  __syncthreads();
  if (threadIdx.x < kWarp) {
    const int lane = int(threadIdx.x);
    int absent = 0;
    for (int e = lane; e < n_experts; e += kWarp) absent += rows_of[e] != 0;
    for (int o = kWarp / 2; o > 0; o /= 2) absent += __shfl_xor_sync(0xffffffffu, absent, o);
    // The table's share counts experts of one row each; the CPU's work is a product a pair, so an
    // expert of several rows spends one of the share a row.
    const int share = link.share[min(absent, kMaxMissShares)];
    const int budget = link.cpu_takes_all ? kMaxMissPairs : min(share, kMaxMissPairs);
    int n = 0, used = 0;  // the experts taken so far, and their pairs
    unsigned long long union_rows = 0;
    // The experts one row chose first (the CPU computes a pair where the GPU reads an expert once
    // for all its rows), then the others, in expert order; the candidates a lane group takes are a
    // prefix of them (both bounds grow along the lanes).
    for (int pass = 0; pass < 2; ++pass)
      for (int c = 0; c < n_experts && n < kMaxMissExperts && used < budget; c += kWarp) {
        const int e = c + lane;
        const unsigned long long m = e < n_experts ? rows_of[e] : 0;
        const int r = __popcll(m);
        const bool candidate = r > 0 && (pass == 0) == (r == 1);
        int before = candidate, before_pairs = candidate ? r : 0;  // inclusive prefix sums
        for (int o = 1; o < kWarp; o *= 2) {
          const int a = __shfl_up_sync(0xffffffffu, before, o), b = __shfl_up_sync(0xffffffffu, before_pairs, o);
          if (lane >= o) before += a, before_pairs += b;
        }
        const bool take = candidate && n + before <= kMaxMissExperts && used + before_pairs <= budget;
        if (take) {
          const int i = n + before - 1;
          taken[e] = int8_t(1 + i);
          first_pair[i] = used + before_pairs - r;
          link.box->expert[i] = e;
          link.box->rows[i] = m;
        }
        unsigned long long took_rows = take ? m : 0;
        for (int o = kWarp / 2; o > 0; o /= 2) took_rows |= __shfl_xor_sync(0xffffffffu, took_rows, o);
        union_rows |= took_rows;
        const unsigned took = __ballot_sync(0xffffffffu, take);
        if (took) {
          const int last = 31 - __clz(took);
          n += __shfl_sync(0xffffffffu, before, last), used += __shfl_sync(0xffffffffu, before_pairs, last);
        }
      }
    if (lane == 0) {
      count = n, read_rows = union_rows;
      link.pending[0] = used;
      link.box->layer = layer;
      link.box->count = n;
      link.box->hinted = 0;
      link.box->grouped = 1;
    }
  }
  __syncthreads();
  if (count == 0) return;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int32_t e = ids[p];
    if (unsigned(e) >= unsigned(n_experts) || !taken[e]) continue;
    const int row = p / k;
    link.pending[1 + first_pair[taken[e] - 1] + __popcll(rows_of[e] & ((1ull << row) - 1))] = p;
  }
  for (int g = threadIdx.x; g < n_groups; g += blockDim.x) {
    const int32_t e = groups[g].id;
    if (unsigned(e) < unsigned(n_experts) && taken[e]) groups[g].id = -1, atomicAdd(&emptied, 1u);
  }
  const int per_row = link.hidden / 4;
  for (int i = threadIdx.x; i < rows * per_row; i += blockDim.x)
    if (read_rows >> (i / per_row) & 1)
      reinterpret_cast<float4*>(link.x)[i] = reinterpret_cast<const float4*>(x)[i];
  post_request(link);  // (its barrier also orders the emptied groups' count)
  if (threadIdx.x == 0 && absent_groups) atomicSub(absent_groups, emptied);
}

// Each block waits for the answer, then moves its share of the outputs with 16-byte loads over
// PCIe, all in flight at once (a loop of dependent reads would pay a round trip each).
__global__ void __launch_bounds__(kMissThreads) miss_gather_kernel(MissLink link, float* y, uint64_t timeout_ns) {
  __shared__ int answered;
  const int count = link.pending[0], per_expert = link.hidden / 4;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x;
  if (count == 0 || first >= int64_t(count) * per_expert) return;
  if (threadIdx.x == 0) {
    const uint32_t number = *link.sequence;
    const volatile uint32_t* done = &link.box->done;
    volatile uint32_t* timed_out = &link.box->timed_out;
    const uint64_t start = global_ns();
    answered = 1;
    for (;;) {
      // (Both read at once: the flag costs no second trip over PCIe. Once a layer of the step has
      // given up, the step fails; the layers after it do not wait their own timeout as well.)
      const uint32_t answer = *done, gave_up = *timed_out;
      if (answer == number) break;
      if (gave_up || global_ns() - start > timeout_ns) {
        *timed_out = 1;
        answered = 0;
        break;
      }
      __nanosleep(100);
    }
    __threadfence_system();
    if (blockIdx.x == 0) link.clock[1] += start - link.clock[0], link.clock[2] += global_ns() - start;
  }
  __syncthreads();
  const int64_t i = first + threadIdx.x;
  if (!answered || i >= int64_t(count) * per_expert) return;
  const int expert = int(i / per_expert), at = int(i % per_expert), position = link.pending[1 + expert];
  const float4 v = __ldcv(reinterpret_cast<const float4*>(link.y + int64_t(expert) * link.hidden) + at);
  reinterpret_cast<float4*>(y + int64_t(position) * link.hidden)[at] = v;
}

// Blocks (b, c): the c-th listed expert's gate, up and down, one after another, strided over the
// blocks of c; four 16-byte loads in flight per thread (host memory answers in microseconds).
constexpr int kStageBlocks = 48;
__global__ void __launch_bounds__(kMissThreads)
    miss_stage_kernel(MissStage s, const int32_t* ids, int k, const void* const* table, int n_experts) {
  const int c = blockIdx.y;
  if (c >= s.copies[0]) return;
  const int j = s.copies[1 + c];
  const int32_t expert = ids[j];
  const uint8_t* src[3] = {static_cast<const uint8_t*>(table[expert]), static_cast<const uint8_t*>(table[n_experts + expert]),
                           static_cast<const uint8_t*>(table[2 * n_experts + expert])};
  uint8_t* dst[3] = {s.gate_up + j * s.gate_up_stride, s.gate_up + j * s.gate_up_stride + s.up_at,
                     s.down + j * s.down_stride};
  const size_t bytes[3] = {s.gate_bytes, s.up_bytes, s.down_bytes};
  for (int m = 0; m < 3; ++m) {
    if ((reinterpret_cast<uintptr_t>(src[m]) | reinterpret_cast<uintptr_t>(dst[m]) | bytes[m]) % 16 != 0) {
      for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes[m]; i += size_t(gridDim.x) * blockDim.x)
        dst[m][i] = src[m][i];
      continue;
    }
    const uint4* from = reinterpret_cast<const uint4*>(src[m]);
    uint4* to = reinterpret_cast<uint4*>(dst[m]);
    const size_t words = bytes[m] / 16, stride = size_t(gridDim.x) * blockDim.x;
    size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    for (; i + 3 * stride < words; i += 4 * stride) {
      const uint4 a = __ldcs(from + i), b = __ldcs(from + i + stride), d = __ldcs(from + i + 2 * stride),
                  e = __ldcs(from + i + 3 * stride);
      to[i] = a, to[i + stride] = b, to[i + 2 * stride] = d, to[i + 3 * stride] = e;
    }
    for (; i < words; i += stride) to[i] = __ldcs(from + i);
  }
}

}  // namespace

const char* miss_stage(const MissStage& stage, const int32_t* ids, int k, const void* const* table, int n_experts,
                       void* stream) {
  miss_stage_kernel<<<dim3(kStageBlocks, k), kMissThreads, 0, as_stream(stream)>>>(stage, ids, k, table, n_experts);
  return launched();
}

const char* miss_dispatch(const MissLink& link, int32_t* ids, int k, const uint8_t* resident, int layer,
                          const float* x, const void* const* table, int n_experts, const MissStage& stage,
                          void* stream) {
  if (k > kMaxMissTokenExperts) return "the CPU miss path routes at most 32 experts per token";
  miss_dispatch_kernel<<<1, kMissThreads, 0, as_stream(stream)>>>(link, ids, k, resident, layer, x, table, n_experts,
                                                                  stage);
  return launched();
}

const char* miss_dispatch_rows(const MissLink& link, const int32_t* ids, int rows, int k, const uint8_t* resident,
                               int layer, const float* x, int n_experts, ExpertGroup* groups, int n_groups,
                               void* stream, unsigned* absent_groups) {
  if (rows > kMaxMissRows) return "the CPU miss path serves steps of at most 64 rows";
  if (n_experts > kMaxRoutedExperts) return "the CPU miss path serves models of at most 512 experts a layer";
  if (link.hidden % 4 != 0) return "the CPU miss path moves hidden states of a multiple of 4 values";
  miss_dispatch_rows_kernel<<<1, kMissThreads, 0, as_stream(stream)>>>(link, ids, rows, k, resident, layer, x,
                                                                       n_experts, groups, n_groups, absent_groups);
  return launched();
}

const char* miss_hint(const MissLink& link, const int32_t* predicted, int k, const uint8_t* resident, int layer,
                      void* stream) {
  if (k > kMaxMissTokenExperts) return "the CPU miss path routes at most 32 experts per token";
  miss_hint_kernel<<<1, 32, 0, as_stream(stream)>>>(link, predicted, k, resident, layer);
  return launched();
}

const char* miss_gather(const MissLink& link, float* y, int pairs, uint64_t timeout_ns, void* stream) {
  if (link.hidden % 4 != 0) return "the CPU miss path moves hidden states of a multiple of 4 values";
  const unsigned blocks = blocks_for(int64_t(std::min(pairs, kMaxMissPairs)) * link.hidden / 4, kMissThreads);
  miss_gather_kernel<<<blocks, kMissThreads, 0, as_stream(stream)>>>(link, y, timeout_ns);
  return launched();
}

const char* set_experts(const void** tables, uint8_t* flags, int64_t n_experts, const ExpertEntries& entries,
                        void* stream) {
  if (entries.count <= 0) return nullptr;
  set_experts_kernel<<<1, kMaxExpertEntries, 0, as_stream(stream)>>>(tables, flags, n_experts, entries);
  return launched();
}

}  // namespace lode::cuda::kernels
