#include "cuda/prompt_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cuda/kernel_math.cuh"
#include "cuda/kv_cells.cuh"

namespace lode::cuda::kernels {

namespace {

constexpr int kScanWarps = 8;
constexpr int kScanMaxColumns = 32;     // per block, at most (ScanLayout)
constexpr int kScanTileFloats = 4096;   // q and k of a tile of tokens: at most this many floats each
constexpr int kScanMaxTile = 64;
// Blocks a multiprocessor holds (registers held to 64 a thread).
constexpr int kScanBlocksPerSm = 4;

__host__ __device__ inline int scan_tile(int dk) { return min(kScanMaxTile, kScanTileFloats / dk); }

// How a scan block lays a value head's state out: each state column (a recurrence) on kLanes lanes
// of a warp, each lane kKeys consecutive key rows of kCols adjacent columns in registers
// (deltanet_scan picks a layout with dk <= kLanes kKeys), so a warp takes kCols 32 / kLanes columns
// and a block kScanWarps times that. A column's two sums a token (S^T k and S q) meet over its
// kLanes lanes in log2(kLanes) shuffles, all of a warp's columns in the same instructions; a lane's
// kCols columns share its reads of q and k. Each column's float steps are the same in every layout
// of one kLanes and kKeys, so kCols does not change its bits. (The layout before, a column's keys
// across all 32 lanes, four columns a warp, took eight warp sums of five shuffles a token and was
// bound by the shuffle unit: an H100 spent 2.7 us a token in a pass of 4 prompts.)
template <int kLanes, int kKeys, int kCols = 1>
struct ScanLayout {
  static constexpr int kColumnsPerWarp = kWarp / kLanes * kCols;
  static constexpr int kColumns = kColumnsPerWarp * kScanWarps;
  static_assert(kColumns <= kScanMaxColumns && kKeys % 4 == 0);  // (q and k read four at a time)
};

// The sequences of one scan launch (kernel parameters: no copy to the device first).
constexpr int kMaxScanSequences = 16;
struct ScanBatch {
  ScanRows rows[kMaxScanSequences];
};

// Block (value head s, L::kColumns state columns) of one sequence's scan, in its layout L: lane l of
// warp w holds columns kCols (l / kLanes) .. + kCols - 1 of the warp's, rows kKeys (l % kLanes) .. +
// kKeys - 1, in registers across the chunk. Tokens go in tiles whose q and k rows (shared by every column of the
// head) are staged in shared memory once; a lane reads its keys' q and k four at a time.
template <int kLanes, int kKeys, int kCols>
__device__ __forceinline__ void scan_block(float* state, const float* qkv, int channels, const float* b,
                                           const float* alpha, const float* a, const float* dt_bias, int hk, int hv,
                                           int dk, int dv, int n_tokens, float* o) {
  using L = ScanLayout<kLanes, kKeys, kCols>;
  extern __shared__ float4 tile_qk4[];  // q [tile][dk], then k [tile][dk]
  __shared__ float tile_v[kScanMaxTile][kScanMaxColumns], tile_beta[kScanMaxTile], tile_decay[kScanMaxTile];
  const int tile = scan_tile(dk);
  float* const tq = reinterpret_cast<float*>(tile_qk4);
  float* const tk = tq + tile * dk;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int groups = (dv + L::kColumns - 1) / L::kColumns;
  const int s = blockIdx.x / groups, j0 = (blockIdx.x % groups) * L::kColumns;
  const int key_dim = hk * dk, head = s % hk;
  const int local = warp * L::kColumnsPerWarp + lane / kLanes * kCols, j = j0 + local;  // a lane's first column
  const int key0 = (lane % kLanes) * kKeys;                                              // and first key row
  const auto column = [&](int c) { return j + c < dv; };
  const auto in_key = [&](int m) { return key0 + m < dk; };
  float col[kCols][kKeys];
#pragma unroll
  for (int c = 0; c < kCols; ++c)
#pragma unroll
    for (int m = 0; m < kKeys; ++m)
      col[c][m] = column(c) && in_key(m) ? state[(int64_t(s) * dk + key0 + m) * dv + j + c] : 0.0f;
  const float a_s = a[s], bias = dt_bias[s];
  // A lane's keys' k of row t of the staged tile (dk a multiple of 4: whole float4s, zeros past dk).
  const auto keys_of = [&](int t, float (&out)[kKeys]) {
#pragma unroll
    for (int m = 0; m < kKeys; m += 4) {
      const float4 v = key0 + m < dk ? *reinterpret_cast<const float4*>(tk + t * dk + key0 + m)
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      out[m] = v.x, out[m + 1] = v.y, out[m + 2] = v.z, out[m + 3] = v.w;
    }
  };
  // The sum of a column's kLanes lanes, in every one of them.
  const auto column_sum = [](float v) {
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
  };
  for (int t0 = 0; t0 < n_tokens; t0 += tile) {
    const int count = min(tile, n_tokens - t0);
    __syncthreads();  // the previous tile is done with
    for (int i = threadIdx.x; i < count * dk; i += blockDim.x) {
      const float* row = qkv + int64_t(t0 + i / dk) * channels;
      tq[i] = row[head * dk + i % dk];
      tk[i] = row[key_dim + head * dk + i % dk];
    }
    for (int i = threadIdx.x; i < count * L::kColumns; i += blockDim.x) {
      const int jj = j0 + i % L::kColumns;
      tile_v[i / L::kColumns][i % L::kColumns] =
          jj < dv ? qkv[int64_t(t0 + i / L::kColumns) * channels + 2 * key_dim + int64_t(s) * dv + jj] : 0.0f;
    }
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      tile_beta[i] = sigmoidf(b[int64_t(t0 + i) * hv + s]);
      tile_decay[i] = expf(a_s * softplusf(alpha[int64_t(t0 + i) * hv + s] + bias));
    }
    __syncthreads();
    for (int t = 0; t < count; ++t) {
      float kk[kKeys];
      keys_of(t, kk);
      const float decay = tile_decay[t], beta = tile_beta[t];
      float kv[kCols], d[kCols], out[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        kv[c] = 0.0f;
#pragma unroll
        for (int m = 0; m < kKeys; ++m) {
          col[c][m] *= decay;
          kv[c] += col[c][m] * kk[m];
        }
      }
#pragma unroll
      for (int c = 0; c < kCols; ++c) kv[c] = column_sum(kv[c]);
#pragma unroll
      for (int c = 0; c < kCols; ++c) d[c] = beta * (tile_v[t][local + c] - kv[c]), out[c] = 0.0f;
#pragma unroll
      for (int m = 0; m < kKeys; m += 4) {  // (q four at a time: fewer registers)
        const float4 q4 = key0 + m < dk ? *reinterpret_cast<const float4*>(tq + t * dk + key0 + m)
                                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float q[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
        for (int c = 0; c < kCols; ++c)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            col[c][m + i] += kk[m + i] * d[c];
            out[c] += col[c][m + i] * q[i];
          }
      }
#pragma unroll
      for (int c = 0; c < kCols; ++c) out[c] = column_sum(out[c]);
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        if (lane % kLanes == 0 && column(c)) o[int64_t(t0 + t) * hv * dv + int64_t(s) * dv + j + c] = out[c];
    }
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c)
#pragma unroll
    for (int m = 0; m < kKeys; ++m)
      if (column(c) && in_key(m)) state[(int64_t(s) * dk + key0 + m) * dv + j + c] = col[c][m];
}

// One sequence: its pointers are the kernel's parameters. (Read from a batch's array they took
// registers, and an 8,192-token prompt's scans ran 15% longer on an H100: stop 70, the layout before.)
template <int kLanes, int kKeys, int kCols>
__global__ void __launch_bounds__(kScanWarps * kWarp, kScanBlocksPerSm)
    deltanet_scan_kernel(float* state, const float* qkv, int channels, const float* b, const float* alpha,
                         const float* a, const float* dt_bias, int hk, int hv, int dk, int dv, int n_tokens, float* o) {
  scan_block<kLanes, kKeys, kCols>(state, qkv, channels, b, alpha, a, dt_bias, hk, hv, dk, dv, n_tokens, o);
}

// Several sequences (blockIdx.y: the sequence), each block's work that of its sequence alone.
template <int kLanes, int kKeys, int kCols>
__global__ void __launch_bounds__(kScanWarps * kWarp, kScanBlocksPerSm)
    deltanet_scan_batch_kernel(ScanBatch batch, int channels, const float* a, const float* dt_bias, int hk, int hv,
                               int dk, int dv) {
  const ScanRows& seq = batch.rows[blockIdx.y];
  scan_block<kLanes, kKeys, kCols>(seq.state, seq.qkv, channels, seq.b, seq.alpha, a, dt_bias, hk, hv, dk, dv,
                                   seq.n_tokens, seq.o);
}

__global__ void conv_rows_kernel(const float* in, float* out, const float* state, const float* w, int channels,
                                 int kernel, int n_tokens) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
  if (c >= channels) return;
  const int keep = kernel - 1;
  const float* wc = w + int64_t(c) * kernel;
  float acc = 0.0f;  // the decode kernel's order: the kept inputs first, the newest last
  for (int k = 0; k < keep; ++k) {
    const int source = t - keep + k;
    acc += wc[k] * (source >= 0 ? in[int64_t(source) * channels + c] : state[int64_t(c) * keep + keep + source]);
  }
  acc += wc[keep] * in[int64_t(t) * channels + c];
  out[int64_t(t) * channels + c] = siluf(acc);
}

// The state takes the last `keep` inputs of the chunk (older state entries when the chunk is shorter).
__global__ void conv_state_kernel(const float* in, float* state, int channels, int keep, int n_tokens) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels || keep == 0) return;
  float* sc = state + int64_t(c) * keep;
  float window[16];
  for (int k = 0; k < keep; ++k) {
    const int source = n_tokens - keep + k;  // its place in the chunk; negative: in the old state
    window[k] = source >= 0 ? in[int64_t(source) * channels + c] : sc[keep + source];
  }
  for (int k = 0; k < keep; ++k) sc[k] = window[k];
}

__global__ void gated_norm_kernel(float* o, const float* z, const float* norm_w, int dv, float eps) {
  float* row = o + int64_t(blockIdx.x) * dv;
  const float* zr = z + int64_t(blockIdx.x) * dv;
  float s = 0.0f;
  for (int i = threadIdx.x; i < dv; i += blockDim.x) s += row[i] * row[i];
  const float scale = rsqrtf(block_sum(s) / float(dv) + eps);
  for (int i = threadIdx.x; i < dv; i += blockDim.x) row[i] = row[i] * scale * norm_w[i] * siluf(zr[i]);
}

template <Store KS, Store VS>
__global__ void kv_to_rows_kernel(KvView kv, int64_t row_values, float* k_out, float* v_out) {
  const int64_t pos = blockIdx.x;
  const uint8_t* k = kv_row(kv.k, kv.pages, pos, kv.k_row_bytes);
  const uint8_t* v = kv_row(kv.v, kv.pages, pos, kv.v_row_bytes);
  for (int64_t i = threadIdx.x; i < row_values; i += blockDim.x) {
    k_out[pos * row_values + i] = KvSide<KS>::load(k, row_values, i);
    v_out[pos * row_values + i] = KvSide<VS>::load(v, row_values, i);
  }
}

// x <- H·x for each vector of n values (one block per vector).
__global__ void hadamard_rows_kernel(float* x, int n) {
  __shared__ float row[kKvMaxHeadDim];
  x += int64_t(blockIdx.x) * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] = x[i];
  block_hadamard(row, n);
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = row[i];
}

// One block per (head, query) row.
__global__ void causal_softmax_kernel(float* s, int n_queries, int64_t n_keys, int64_t first_query, float scale) {
  const int t = blockIdx.x % n_queries;
  float* row = s + int64_t(blockIdx.x) * n_keys;
  const int64_t visible = first_query + t + 1;
  float big = -INFINITY;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) big = fmaxf(big, row[j] * scale);
  big = block_max(big);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
    const float p = expf(row[j] * scale - big);
    row[j] = p;
    sum += p;
  }
  const float inv = 1.0f / block_sum(sum);
  for (int64_t j = threadIdx.x; j < n_keys; j += blockDim.x) row[j] = j < visible ? row[j] * inv : 0.0f;
}

__global__ void attention_gate_kernel(float* out, const float* qg, int64_t total, int n_heads, int head_dim) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t q_dim = int64_t(n_heads) * head_dim;
  const int64_t t = i / q_dim, h = (i % q_dim) / head_dim, d = i % head_dim;
  out[i] *= sigmoidf(qg[t * 2 * q_dim + h * 2 * head_dim + head_dim + d]);
}

// A stable counting sort in one block: warp w owns a contiguous range of the assignments; it
// counts them per expert (lanes with the same expert found with __match_any_sync), the counts
// become offsets (expert-major, then warp order), and the warp places its range in order. hist:
// [warps][n_experts] ints of scratch.
constexpr int kGroupWarps = 32;

__global__ void __launch_bounds__(kGroupWarps * kWarp)
    group_by_expert_kernel(const int32_t* ids, int n_tokens, int k, int n_experts, int32_t* sorted, int32_t* slot_of,
                           int32_t* expert_of, int32_t* counts, int32_t* first, int32_t* hist) {
  const int64_t n = int64_t(n_tokens) * k, per_warp = (n + kGroupWarps - 1) / kGroupWarps;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t begin = warp * per_warp, end = min(n, begin + per_warp);
  int32_t* mine = hist + int64_t(warp) * n_experts;
  for (int e = lane; e < n_experts; e += kWarp) mine[e] = 0;
  __syncwarp();
  // The warp's range 32 assignments at a time: visit(a, e, same, active) with the lanes of the same
  // expert in `same`; the lowest of them (the leader) updates that expert's running count.
  const auto walk = [&](auto&& visit) {
    for (int64_t base = begin; base < end; base += kWarp) {
      const int64_t a = base + lane;
      const unsigned active = __ballot_sync(0xffffffffu, a < end);
      if (a < end) {
        const int e = ids[(a / k) * 2 * k + a % k];
        const unsigned same = __match_any_sync(active, e);
        visit(a, e, same, active);
        if (lane == __ffs(same) - 1) mine[e] += __popc(same);
      }
      __syncwarp();
    }
  };
  walk([](int64_t, int, unsigned, unsigned) {});  // counts
  __syncthreads();
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    int32_t c = 0;
    for (int w = 0; w < kGroupWarps; ++w) c += hist[int64_t(w) * n_experts + e];
    counts[e] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t offset = 0;
    for (int e = 0; e < n_experts; ++e) first[e] = offset, offset += counts[e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
    int32_t at = first[e];
    for (int w = 0; w < kGroupWarps; ++w) {
      const int32_t c = hist[int64_t(w) * n_experts + e];
      hist[int64_t(w) * n_experts + e] = at;
      at += c;
    }
  }
  __syncthreads();
  walk([&](int64_t a, int e, unsigned same, unsigned active) {  // places, mine[e] now the next free row
    const int32_t r = mine[e] + __popc(same & ((1u << lane) - 1));
    sorted[r] = int32_t(a);
    slot_of[a] = r;
    expert_of[r] = e;
    __syncwarp(active);  // every lane has read mine[e] before its leader moves it on
  });
}

__global__ void gather_rows_kernel(const float* x, const int32_t* sorted, int k, int n, bool tf32, float* out) {
  const float* src = x + int64_t(sorted[blockIdx.x] / k) * n;
  float* dst = out + int64_t(blockIdx.x) * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = tf32 ? tf32_rounded(src[i]) : src[i];
}

__global__ void swiglu_rows_kernel(const float* gate, const float* up, int64_t ld, int64_t total, int ff, bool tf32,
                                   float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t at = (i / ff) * ld + i % ff;
  const float v = exact::swiglu(gate[at], up[at]);
  out[i] = tf32 ? tf32_rounded(v) : v;
}

__global__ void moe_combine_rows_kernel(const float* y, const int32_t* slot_of, const float* weights, int k,
                                        const float* shared, const float* shared_logit, int hidden, float* out) {
  const int t = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= hidden) return;
  float o = 0.0f;
  for (int j = 0; j < k; ++j)
    o += weights[int64_t(t) * k + j] * y[int64_t(slot_of[int64_t(t) * k + j]) * hidden + i];
  if (shared) o += sigmoidf(shared_logit[t]) * shared[int64_t(t) * hidden + i];
  out[int64_t(t) * hidden + i] = o;
}

}  // namespace

namespace {

// The scans with a column on kLanes lanes, kKeys key rows a lane, kCols columns a lane.
template <int kLanes, int kKeys, int kCols = 1>
const char* scan_with(const ScanRows* sequences, int count, int channels, const float* a, const float* dt_bias, int hk,
                      int hv, int dk, int dv, void* stream) {
  using L = ScanLayout<kLanes, kKeys, kCols>;
  const int groups = (dv + L::kColumns - 1) / L::kColumns;
  const size_t shared = 2 * size_t(scan_tile(dk)) * size_t(dk) * sizeof(float);
  if (count == 1) {
    const ScanRows& seq = sequences[0];
    deltanet_scan_kernel<kLanes, kKeys, kCols><<<hv * groups, kScanWarps * kWarp, shared, as_stream(stream)>>>(
        seq.state, seq.qkv, channels, seq.b, seq.alpha, a, dt_bias, hk, hv, dk, dv, seq.n_tokens, seq.o);
    return launched();
  }
  for (int first = 0; first < count; first += kMaxScanSequences) {
    const int here = std::min(kMaxScanSequences, count - first);
    ScanBatch batch{};
    std::copy(sequences + first, sequences + first + here, batch.rows);
    const dim3 grid(unsigned(hv * groups), unsigned(here));
    deltanet_scan_batch_kernel<kLanes, kKeys, kCols><<<grid, kScanWarps * kWarp, shared, as_stream(stream)>>>(
        batch, channels, a, dt_bias, hk, hv, dk, dv);
    if (const char* err = launched()) return err;
  }
  return nullptr;
}

}  // namespace

// The layout for dk: 8 key rows a lane, a column on as many lanes as that takes: 8 up to 64 rows (32
// columns a block), 16 up to 128 (16), 32 up to 256 (8). (16 rows a lane on 8 lanes spilled at 64
// registers.) Up to 128 rows, a launch of several sequences gives a lane two columns (32 a block):
// half the blocks, so a pass of 4 prompts of the 35B is one wave of 512 blocks, not two (an H100, stop
// 76: its scans 10.5 ms against 16.0, of 8 prompts 20.6 against 30.8). A lone sequence keeps one
// column a lane: two would leave its scan 128 blocks for 132 multiprocessors (not measured).
const char* deltanet_scan(const ScanRows* sequences, int count, int channels, const float* a, const float* dt_bias,
                          int hk, int hv, int dk, int dv, void* stream) {
  if (dk > 256) return "DeltaNet key heads wider than 256";
  if (dk % 4 != 0) return "DeltaNet key heads of a size not a multiple of 4";
  const auto with = [&](auto scan) { return scan(sequences, count, channels, a, dt_bias, hk, hv, dk, dv, stream); };
  if (dk <= 64) return with(scan_with<8, 8>);
  if (dk <= 128) return count > 1 ? with(scan_with<16, 8, 2>) : with(scan_with<16, 8>);
  return with(scan_with<32, 8>);
}

const char* deltanet_conv_rows(const float* in, float* out, float* state, const float* w, int channels, int kernel,
                               int n_tokens, void* stream) {
  if (kernel - 1 > 16) return "DeltaNet conv kernel longer than 17";
  conv_rows_kernel<<<dim3(blocks_for(channels, 256), n_tokens), 256, 0, as_stream(stream)>>>(in, out, state, w, channels,
                                                                                         kernel, n_tokens);
  if (const char* err = launched()) return err;
  conv_state_kernel<<<blocks_for(channels, 256), 256, 0, as_stream(stream)>>>(in, state, channels, kernel - 1, n_tokens);
  return launched();
}

const char* gated_norm_rows(float* o, const float* z, const float* norm_w, int rows, int dv, float eps, void* stream) {
  gated_norm_kernel<<<rows, 128, 0, as_stream(stream)>>>(o, z, norm_w, dv, eps);
  return launched();
}

const char* kv_to_rows(KvView kv, int64_t n_positions, int64_t row_values, float* k_out, float* v_out, void* stream) {
  if (n_positions <= 0) return nullptr;
  return with_stores(kv.format, [&](auto stores) {
    using S = decltype(stores);
    kv_to_rows_kernel<S::k, S::v><<<unsigned(n_positions), 256, 0, as_stream(stream)>>>(kv, row_values, k_out, v_out);
    return launched();
  });
}

const char* hadamard_rows(float* x, int64_t n_vectors, int n, void* stream) {
  if (n > kKvMaxHeadDim || (n & (n - 1)) != 0) return "Hadamard rows must be a power of two, at most 512 wide";
  if (n_vectors <= 0) return nullptr;
  hadamard_rows_kernel<<<unsigned(n_vectors), 128, 0, as_stream(stream)>>>(x, n);
  return launched();
}

const char* causal_softmax(float* s, int heads, int n_queries, int64_t n_keys, int64_t first_query, float scale,
                           void* stream) {
  causal_softmax_kernel<<<heads * n_queries, 256, 0, as_stream(stream)>>>(s, n_queries, n_keys, first_query, scale);
  return launched();
}

const char* attention_gate(float* out, const float* qg, int n_tokens, int n_heads, int head_dim, void* stream) {
  const int64_t total = int64_t(n_tokens) * n_heads * head_dim;
  attention_gate_kernel<<<blocks_for(total, 256), 256, 0, as_stream(stream)>>>(out, qg, total, n_heads, head_dim);
  return launched();
}

const char* group_by_expert(const int32_t* ids, int n_tokens, int k, int n_experts, int32_t* sorted,
                            int32_t* slot_of, int32_t* expert_of, int32_t* counts, int32_t* first, int32_t* hist,
                            void* stream) {
  group_by_expert_kernel<<<1, kGroupWarps * kWarp, 0, as_stream(stream)>>>(ids, n_tokens, k, n_experts, sorted,
                                                                          slot_of, expert_of, counts, first, hist);
  return launched();
}

const char* gather_rows(const float* x, const int32_t* sorted, int k, int rows, int n, bool tf32, float* out,
                        void* stream) {
  if (rows == 0) return nullptr;
  gather_rows_kernel<<<rows, 256, 0, as_stream(stream)>>>(x, sorted, k, n, tf32, out);
  return launched();
}

const char* swiglu_rows(const float* gate, const float* up, int64_t ld, int rows, int ff, bool tf32, float* out,
                        void* stream) {
  const int64_t total = int64_t(rows) * ff;
  swiglu_rows_kernel<<<blocks_for(total, 256), 256, 0, as_stream(stream)>>>(gate, up, ld, total, ff, tf32, out);
  return launched();
}

const char* moe_combine_rows(const float* y, const int32_t* slot_of, const float* weights, int k, const float* shared,
                             const float* shared_logit, int n_tokens, int hidden, float* out, void* stream) {
  moe_combine_rows_kernel<<<dim3(blocks_for(hidden, 256), n_tokens), 256, 0, as_stream(stream)>>>(
      y, slot_of, weights, k, shared, shared_logit, hidden, out);
  return launched();
}

}  // namespace lode::cuda::kernels
