#include "cuda/forward_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cuda/kernel_math.cuh"
#include "cuda/kv_cells.cuh"

namespace lode::cuda::kernels {

namespace {

__global__ void rms_norm_kernel(const float* x, const float* w, const float* w_odd, float* out, int n, float eps) {
  begin_after_inputs();
  if (w_odd && blockIdx.x % 2 == 1) w = w_odd;
  const float* xr = x + int64_t(blockIdx.x) * n;
  float* outr = out + int64_t(blockIdx.x) * n;
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i] * xr[i];
  const float scale = rsqrtf(block_sum(s) / float(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) outr[i] = xr[i] * scale * w[i];
}

// Row t of the MTP block's input (rows [n][2 hidden]): the embedding then the state, and its
// sequence, K/V row and rotary shift.
__global__ void mtp_window_rows_kernel(const float* embedded, const float* states, int hidden, MtpRowPlaces places,
                                       float* rows, int32_t* sequences, int64_t* kv_rows, int64_t* shifts) {
  begin_after_inputs();
  const int t = blockIdx.x;
  float* row = rows + int64_t(t) * 2 * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    row[i] = embedded[int64_t(t) * hidden + i];
    row[hidden + i] = states[int64_t(t) * hidden + i];
  }
  if (threadIdx.x == 0) sequences[t] = places.sequence, kv_rows[t] = places.first_row + t, shifts[t] = places.shift;
}

__global__ void window_kept_kernel(const int32_t* greedy, WindowTokens window, int32_t* kept) {
  begin_after_inputs();
  int32_t a = 1;
  while (a < window.n && greedy[a - 1] == window.tokens[a]) ++a;
  *kept = a;
}

__global__ void mtp_continued_row_kernel(const int32_t* kept, const float* states, const int32_t* drafts, int hidden,
                                         MtpRowPlaces places, float* row, int32_t* id, int32_t* sequences,
                                         int64_t* kv_rows, int64_t* shifts) {
  begin_after_inputs();
  const int32_t from = *kept - 1;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) row[hidden + i] = states[int64_t(from) * hidden + i];
  if (threadIdx.x == 0) {
    *id = drafts[from];
    sequences[0] = places.sequence, kv_rows[0] = places.first_row + from + 1, shifts[0] = places.shift;
  }
}

// The residual-and-norm kernels: 1024 threads, each value of the row in a register of its thread
// from the add to the norm (read back from memory, the sum's stores cost another trip), and the
// norm's weights loaded before the wait. kPer values a thread (value i = threadIdx.x + r 1024, r <
// kPer: the launch picks the fewest that cover the row), their loads without a branch (an index past
// the row reads its last value, which is then not stored), so that all of a thread's loads go out at
// once: one trip to L2, not one per value.
constexpr int kNormThreads = 1024, kMaxNormed = kNormThreads * 8;

__device__ __forceinline__ int norm_index(int r) {
  return int(threadIdx.x) + r * kNormThreads;
}

template <int kPer>
__device__ __forceinline__ void norm_weights(const float* w, int n, float (&out)[kPer]) {
#pragma unroll
  for (int r = 0; r < kPer; ++r) out[r] = w ? w[min(norm_index(r), n - 1)] : 0.0f;
}

// h[i] = v, and the sum of squares of this thread's values in the row (in r order).
template <int kPer>
__device__ __forceinline__ float store_residual(const float (&v)[kPer], int n, float* h) {
  float s = 0.0f;
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int i = norm_index(r);
    if (i >= n) continue;
    h[i] = v[r];
    s += v[r] * v[r];
  }
  return s;
}

template <int kPer>
__device__ __forceinline__ void write_normed(const float (&v)[kPer], const float (&w)[kPer], float scale, int n,
                                             float* out) {
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int i = norm_index(r);
    if (i < n) out[i] = v[r] * scale * w[r];
  }
}

// h += d, then out = h * rsqrt(mean(h^2) + eps) * w: a residual and the norm after it, one pass.
template <int kPer>
__global__ void __launch_bounds__(kNormThreads)
    add_rms_norm_kernel(float* h, const float* d, const float* w, float* out, int n, float eps) {
  float wr[kPer];
  norm_weights<kPer>(w, n, wr);
  begin_after_inputs();
  const int64_t row = int64_t(blockIdx.x) * n;
  h += row, d += row, out += row;
  float before[kPer], v[kPer];
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int at = min(norm_index(r), n - 1);
    before[r] = h[at], v[r] = d[at];
  }
#pragma unroll
  for (int r = 0; r < kPer; ++r) v[r] = before[r] + v[r];
  const float s = store_residual<kPer>(v, n, h);
  write_normed<kPer>(v, wr, rsqrtf(block_sum(s) / float(n) + eps), n, out);
}

// launch(P) for the fewest P of 1, 2, 4, ... kMax (a power of two) with P * unit >= n (kMax when
// none is: the caller has refused wider n).
template <int kMax, int P = 1, class Launch>
cudaError_t with_fewest_per_unit(int n, int unit, Launch&& launch) {
  if constexpr (P < kMax) {
    if (n > P * unit) return with_fewest_per_unit<kMax, 2 * P>(n, unit, launch);
  }
  return launch(std::integral_constant<int, P>{});
}

// The launch's values a thread: the fewest of 1, 2, 4, 8 that cover n (at most kMaxNormed).
template <class Launch>
cudaError_t with_values_per_thread(int n, Launch&& launch) {
  return with_fewest_per_unit<8>(n, kNormThreads, launch);
}

// The rotation of one position for a thread's rotary pairs i = threadIdx.x + r blockDim.x (r <
// kPairsPerThread) of rope_dims: cos and sin of pos times the pair's frequency (cpu/ops.cpp's
// float(1 / theta^(2i / rope_dims))). They need only the position, so a kernel computes them
// before it waits for its inputs: the double-precision power is a long dependent chain.
constexpr int kPairsPerThread = 2;  // a 128-thread block and rotary pairs of at most a 512-value head

struct PairRotation {
  float c[kPairsPerThread], s[kPairsPerThread];

  __device__ PairRotation(int rope_dims, int64_t pos, double theta) {
#pragma unroll
    for (int r = 0; r < kPairsPerThread; ++r) {
      const int i = int(threadIdx.x) + r * int(blockDim.x);
      c[r] = 1.0f, s[r] = 0.0f;
      if (i < rope_dims / 2) {
        const float inv_freq = float(1.0 / pow(theta, double(2 * i) / double(rope_dims)));
        const float angle = float(pos) * inv_freq;
        c[r] = cosf(angle), s[r] = sinf(angle);
      }
    }
  }
};

// One vector of head_dim: RMS-normed with w, NeoX-rotated on its first rope_dims, by one block.
__device__ void norm_and_rotate(float* v, const float* w, int head_dim, int rope_dims, const PairRotation& turn,
                                float eps) {
  float s = 0.0f;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) s += v[i] * v[i];
  const float scale = rsqrtf(block_sum(s) / float(head_dim) + eps);
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v[i] = v[i] * scale * w[i];
  __syncthreads();
  const int half = rope_dims / 2;
#pragma unroll
  for (int r = 0; r < kPairsPerThread; ++r) {
    const int i = int(threadIdx.x) + r * int(blockDim.x);
    if (i >= half) break;
    const float a = v[i], b = v[i + half];
    v[i] = a * turn.c[r] - b * turn.s[r];
    v[i + half] = b * turn.c[r] + a * turn.s[r];
  }
  __syncthreads();
}

// Blocks [0, n_heads): query heads (rotated by H when the keys are stored rotated, so q·k needs
// no unrotation); [n_heads, n_heads + n_kv_heads): key heads, normed and rotated in k (scratch) and
// then written with v into the token's cache rows in their stores.
template <Store KS, Store VS>
__global__ void attention_prepare_kernel(float* qg, float* k, const float* v, const float* q_norm,
                                         const float* k_norm, KvView kv, const int64_t* position, int n_heads,
                                         int head_dim, int rope_dims, double theta, float eps, int64_t stacked_stride,
                                         const int64_t* rotary_shift) {
  const int t = blockIdx.y;  // the token of a prompt chunk or a window, or a step's row
  const RowPlace place = row_place(kv, position, t);  // written before the step (or the prompt's chunk) began
  const int64_t pos = place.position;
  const PairRotation turn(rope_dims, pos + (rotary_shift ? rotary_shift[kv.row_sequence ? t : 0] : 0), theta);
  begin_after_inputs();
  const int n_kv_heads = int(gridDim.x) - n_heads;
  const int64_t row = int64_t(n_kv_heads) * head_dim;
  qg += int64_t(t) * (stacked_stride ? stacked_stride : 2 * n_heads * head_dim);
  k += int64_t(t) * (stacked_stride ? stacked_stride : row);
  v += int64_t(t) * (stacked_stride ? stacked_stride : row);
  if (int(blockIdx.x) < n_heads) {
    float* q = qg + int64_t(blockIdx.x) * 2 * head_dim;
    norm_and_rotate(q, q_norm, head_dim, rope_dims, turn, eps);
    if constexpr (KvSide<KS>::rotated) block_hadamard(q, head_dim);
    return;
  }
  const int h = int(blockIdx.x) - n_heads;
  norm_and_rotate(k + int64_t(h) * head_dim, k_norm, head_dim, rope_dims, turn, eps);
  __shared__ float x[kKvMaxHeadDim];
  store_head<KS, VS>(kv, place.pages, k + int64_t(h) * head_dim, v + int64_t(h) * head_dim, pos, h, n_kv_heads,
                     head_dim, x);
}

// Rows k and v [n_tokens][heads * head_dim] written as they are into positions first.. of the cache:
// block (h, t) writes head h of token t.
template <Store KS, Store VS>
__global__ void kv_write_kernel(KvView kv, const float* k, const float* v, int64_t first, int heads, int head_dim) {
  const int64_t t = blockIdx.y, offset = t * heads * head_dim + int64_t(blockIdx.x) * head_dim;
  __shared__ float x[kKvMaxHeadDim];
  store_head<KS, VS>(kv, kv.pages, k + offset, v + offset, first + t, int(blockIdx.x), heads, head_dim, x);
}

// Decode's causal conv and L2 norms in one pass: block b takes channels [b dk, (b + 1) dk) of the
// token's Q | K | V row (one key head of q, of k, or dk channels of v), runs each channel's conv
// (state [channels][kernel - 1], shifted) and SiLU, and L2-normalises the q and k heads.
// The conv's taps and its state (the previous kernel - 1 inputs, which only this kernel writes, a
// step earlier) are loaded before the wait, so that after it only the new input is a trip to memory.
constexpr int kMaxConvTaps = 8;

// The DeltaNet kernels' rows (kernels::TokenRows): runs of consecutive rows of one sequence, each
// taken in order by the blocks of its first row (blockIdx.y; the others return at once), its state
// state_offset floats on. Without sequences, all the rows are one run of sequence 0's.
struct RowRun {
  int begin, end;  // begin -1: not this block's
  int64_t state_offset;
};
__device__ __forceinline__ RowRun row_run(const kernels::TokenRows& tokens) {
  if (!tokens.sequence) return {0, tokens.n, 0};
  const int t = blockIdx.y;
  const int32_t q = tokens.sequence[t];
  if (t > 0 && tokens.sequence[t - 1] == q) return {-1, -1, 0};
  int end = t + 1;
  while (end < tokens.n && tokens.sequence[end] == q) ++end;
  return {t, end, int64_t(q) * tokens.state_stride};
}
// Blocks in y a launch of these rows takes: one per row, with sequences.
inline unsigned run_blocks(const kernels::TokenRows& tokens) { return tokens.sequence ? unsigned(tokens.n) : 1u; }

template <bool kWindow>
__global__ void conv_l2_kernel(float* qkv, float* state, const float* w, int channels, int kernel, int hk, int dk,
                               kernels::TokenRows tokens) {
  const int c = blockIdx.x * dk + threadIdx.x;
  const bool inside = int(threadIdx.x) < dk && c < channels;
  const int keep = kernel - 1;
  const RowRun run = row_run(tokens);
  if (run.begin < 0) return;
  state += run.state_offset;
  const float* wc = w + int64_t(c) * kernel;
  float* sc = state + int64_t(c) * keep;
  float taps[kMaxConvTaps], kept[kMaxConvTaps];
#pragma unroll
  for (int k = 0; k < kMaxConvTaps; ++k) {
    taps[k] = inside && k < kernel ? wc[k] : 0.0f;
    kept[k] = inside && k < keep ? sc[k] : 0.0f;
  }
  begin_after_inputs();
  // One token's row: the conv over the kept inputs and this one, which joins them (in registers,
  // and in the state where `store`).
  // (input: row[c], read by the caller, which in a window reads the next token's before this one's
  // sums.)
  const auto token = [&](float* row, float input, bool store) {
    float y = 0.0f;
    if (inside) {
      float acc = 0.0f, last_tap = 0.0f;
#pragma unroll
      for (int k = 0; k < kMaxConvTaps; ++k) {
        if (k < keep) acc += taps[k] * kept[k];
        if (k == keep) last_tap = taps[k];
      }
      acc += last_tap * input;
#pragma unroll
      for (int k = 0; k + 1 < kMaxConvTaps; ++k)
        if (k + 1 < keep) {
          if (store) sc[k] = kept[k + 1];
          kept[k] = kept[k + 1];
        }
      if (keep > 0) {
        if (store) sc[keep - 1] = input;
#pragma unroll
        for (int k = 0; k < kMaxConvTaps; ++k)
          if (k == keep - 1) kept[k] = input;
      }
      y = siluf(acc);
    }
    if (int(blockIdx.x) < 2 * hk) {  // a q head (also scaled by 1/sqrt(dk)) or a k head
      float scale = rsqrtf(block_sum(inside ? y * y : 0.0f) + 1e-6f);
      if (int(blockIdx.x) < hk) scale *= rsqrtf(float(dk));
      y *= scale;
    }
    if (inside) row[c] = y;
  };
  if constexpr (!kWindow) {
    token(qkv, inside ? qkv[c] : 0.0f, true);
  } else {  // the run's tokens in order; the state written after the last (and, where kept, before each
            // but the first)
    float next = inside ? qkv[run.begin * tokens.in_stride + c] : 0.0f;
    for (int t = run.begin; t < run.end; ++t) {
      const float input = next;
      if (inside && t + 1 < run.end) next = qkv[(t + 1) * tokens.in_stride + c];
      if (tokens.kept && inside && t > run.begin) {
        float* to = tokens.kept + (t - 1) * tokens.kept_stride + int64_t(c) * keep;
#pragma unroll
        for (int k = 0; k < kMaxConvTaps; ++k)
          if (k < keep) to[k] = kept[k];
      }
      token(qkv + t * tokens.in_stride, input, t + 1 == run.end);
    }
  }
}

// Blocks [0, hk): q heads (also scaled by 1/sqrt(dk)); [hk, 2 hk): k heads.
__global__ void l2_norm_heads_kernel(float* qkv, int hk, int dk, int channels) {
  float* v = qkv + int64_t(blockIdx.y) * channels + int64_t(blockIdx.x) * dk;  // q heads then k heads are contiguous: [Q | K | ...]
  float s = 0.0f;
  for (int i = threadIdx.x; i < dk; i += blockDim.x) s += v[i] * v[i];
  float scale = rsqrtf(block_sum(s) + 1e-6f);
  if (int(blockIdx.x) < hk) scale *= rsqrtf(float(dk));
  for (int i = threadIdx.x; i < dk; i += blockDim.x) v[i] *= scale;
}

// The delta rule for one token, one block per value head s. Lane (g, c) of warp w, g = lane / Q
// and c = lane % Q (G = 16 row groups of Q = 2 words a warp), holds columns 4 (Q w + c) .. + 3 of the head's [dk][dv] state at
// rows g, g + G, ..., one 16-byte word a row (a warp's load: G rows of Q whole words). The sums
// over rows (S^T k of the decayed state, then S^T q of the updated one) are a thread's rows, then
// the warp's row groups by shuffles: no barrier until the gated RMSNorm over the head's columns.
// No earlier kernel of the step writes the state, so it is loaded before the wait while the
// kernels before finish; after the wait, one trip to memory for the inputs. (The form before
// held a column a thread in 1,024 threads and met at three barriers for the row sums: on the
// H200, the 35B synth, 492.8-498.1 tokens/s against 499.0-503.3 for this one in three calls;
// lode-mini 4,828 against 5,146-5,258.)
constexpr int kStepRowGroups = 16, kStepMaxKeyDim = 128, kStepMaxThreads = 512;
constexpr int kStepColumnsPerWarp = 4 * kWarp / kStepRowGroups;
constexpr int kStepMaxValueDim = kStepColumnsPerWarp * kStepMaxThreads / kWarp;

// One token's inputs to a value head's step: q and k of its key head (dk each), v and z of the
// head (dv each), b and alpha; in global memory as the products left them, or staged (StepStage).
struct StepInputs {
  const float *q, *k, *v, *z, *b, *alpha;
};
__device__ __forceinline__ StepInputs step_inputs(const float* qkv, const float* z, const float* b, const float* alpha,
                                                  int s, int hk, int dk, int dv) {
  const int key_dim = hk * dk;
  return {qkv + (s % hk) * dk, qkv + key_dim + (s % hk) * dk, qkv + 2 * key_dim + int64_t(s) * dv, z + int64_t(s) * dv,
          b + s, alpha + s};
}

// A window's tokens' inputs for one value head, copied into shared memory by the whole block in one
// trip to memory, kStageTokens tokens at a time: each token's then read there, not after the token
// before it is done. A token's floats: q, k (dk each), v, z (dv each), b, alpha. (H100, the 35B
// synth, two rounds against the form that read each token's inputs after the token before: windows
// of 2 2.896 / 2.928 ms against 2.972 / 2.944, of 4 4.281 / 4.285 against 4.382 / 4.367.)
constexpr int kStageTokens = 4, kStageFloats = 2 * kStepMaxKeyDim + 2 * kStepMaxValueDim + 2;
struct StepStage {
  float at[kStageTokens][kStageFloats];
  __device__ StepInputs of(int t, int dk, int dv) const {
    const float* f = at[t];
    return {f, f + dk, f + 2 * dk, f + 2 * dk + dv, f + 2 * dk + 2 * dv, f + 2 * dk + 2 * dv + 1};
  }
  // Tokens first .. first + n - 1 (n <= kStageTokens); every thread of the block takes part.
  __device__ void load(const float* qkv, const float* z, const float* b, const float* alpha, const kernels::TokenRows& tokens,
                       int first, int n, int s, int hk, int dk, int dv) {
    const int per_token = 2 * dk + 2 * dv + 2;
    for (int i = threadIdx.x; i < n * per_token; i += blockDim.x) {
      const int t = i / per_token, j = i % per_token;
      const int64_t in = int64_t(first + t) * tokens.in_stride;
      const StepInputs from = step_inputs(qkv + in, z + in, b + in, alpha + in, s, hk, dk, dv);
      const float value = j < dk ? from.q[j] : j < 2 * dk ? from.k[j - dk] : j < 2 * dk + dv ? from.v[j - 2 * dk]
                          : j < 2 * dk + 2 * dv ? from.z[j - 2 * dk - dv] : j == 2 * dk + 2 * dv ? *from.b : *from.alpha;
      at[t][j] = value;
    }
  }
};

template <bool kWindow>
__global__ void __launch_bounds__(kStepMaxThreads)
    deltanet_step_kernel(float* state, const float* qkv, const float* z, const float* b, const float* alpha,
                         const float* a, const float* dt_bias, const float* norm_w, int hk, int dk, int dv, float eps,
                         float* o, kernels::TokenRows tokens) {
  constexpr int G = kStepRowGroups, Q = kWarp / G, R = kStepMaxKeyDim / G;  // column words a warp's row, rows a thread
  const int s = blockIdx.x, lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  const int g = lane / Q, j0 = 4 * (Q * warp + lane % Q);
  const bool column = j0 < dv;  // dv is a multiple of 4
  const RowRun run = row_run(tokens);
  if (run.begin < 0) return;
  state += run.state_offset;
  float4* S = reinterpret_cast<float4*>(state + int64_t(s) * dk * dv + j0);
  float4 st[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int i = g + G * r;
    st[r] = column && i < dk ? S[int64_t(i) * dv / 4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float weight[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) weight[e] = column ? norm_w[j0 + e] : 0.0f;
  const float a_s = a[s], bias = dt_bias[s];
  begin_after_inputs();
  // The gated RMSNorm's squares, a warp's each; a window's consecutive tokens use the two halves in
  // turn, so a token's may be written while the token before's are still read.
  __shared__ float warp_squares[2][kStepMaxThreads / kWarp];
  // One token's update, output and (where `store`) the state written back.
  const auto token = [&](const StepInputs& in, float* o, bool store, int parity) {
    float q[R], k[R], v[4], zj[4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int i = g + G * r;
      q[r] = i < dk ? in.q[i] : 0.0f;
      k[r] = i < dk ? in.k[i] : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = column ? in.v[j0 + e] : 0.0f;
      zj[e] = column ? in.z[j0 + e] : 0.0f;
    }
    const float beta = sigmoidf(*in.b);
    const float decay = expf(a_s * softplusf(*in.alpha + bias));
    const auto over_rows = [](float (&x)[4]) {
#pragma unroll
      for (int offset = Q; offset < kWarp; offset *= 2)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] += __shfl_xor_sync(0xffffffffu, x[e], offset);
    };
    float sk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float* w = &st[r].x;
#pragma unroll
      for (int e = 0; e < 4; ++e) w[e] *= decay, sk[e] += w[e] * k[r];
    }
    over_rows(sk);
    float d[4], out[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int e = 0; e < 4; ++e) d[e] = column ? beta * (v[e] - sk[e]) : 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float* w = &st[r].x;
#pragma unroll
      for (int e = 0; e < 4; ++e) w[e] += k[r] * d[e], out[e] += w[e] * q[r];
      if (const int i = g + G * r; store && column && i < dk) S[int64_t(i) * dv / 4] = st[r];
    }
    over_rows(out);
    // The gated RMSNorm: the head's squares by row group 0's lanes, summed over the warp's words,
    // then over the warps in order.
    float squares = g == 0 ? out[0] * out[0] + out[1] * out[1] + out[2] * out[2] + out[3] * out[3] : 0.0f;
#pragma unroll
    for (int offset = 1; offset < Q; offset *= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
    if (lane == 0) warp_squares[parity][warp] = squares;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < int(blockDim.x) / kWarp; ++w) total += warp_squares[parity][w];
    const float scale = rsqrtf(total / float(dv) + eps);
    if (g == 0 && column)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[int64_t(s) * dv + j0 + e] = out[e] * scale * weight[e] * siluf(zj[e]);
  };
  if constexpr (!kWindow) {
    token(step_inputs(qkv, z, b, alpha, s, hk, dk, dv), o, true, 0);
  } else {  // the run's tokens in order, the state in registers between them, written after the last
    __shared__ StepStage stage;
    for (int first = run.begin; first < run.end; first += kStageTokens) {
      // (No barrier before the stage is written again: every warp read its tokens before their norms'.)
      const int n = min(kStageTokens, run.end - first);
      stage.load(qkv, z, b, alpha, tokens, first, n, s, hk, dk, dv);
      __syncthreads();
      for (int t = first; t < first + n; ++t) {
        if (tokens.kept && t > run.begin) {  // the state before token t, where it is kept
          float4* to =
              reinterpret_cast<float4*>(tokens.kept + (t - 1) * tokens.kept_stride + int64_t(s) * dk * dv + j0);
#pragma unroll
          for (int r = 0; r < R; ++r)
            if (const int i = g + G * r; column && i < dk) to[int64_t(i) * dv / 4] = st[r];
        }
        token(stage.of(t - first, dk, dv), o + t * tokens.out_stride, t + 1 == run.end, (t - run.begin) % 2);
      }
    }
  }
}

// One warp (lane: its lane): softmax, top k by repeated arg-max (ties: lower index), renormalised
// weights; returns slot `lane`'s choice (lanes < k), which write_route stores. Each lane keeps the
// probabilities of experts lane + 32 i, i < P, in registers (a launch's P: the fewest powers of two
// that hold its experts, 8 for 256, where 16 were always scanned before); a round's arg-max is the
// lane's own (a tree of pairs, log P compares deep) and then two warp reductions: the largest
// probability (non-negative floats order as their bits), then the lowest expert holding it. Logits
// are read through L2 (another block may have written them). On the H200 a clock in the 35B's step
// put this warp's work at 3.9 us of the router's 7.8 on the chain before, 3.1 after.
constexpr int kMaxExpertsPerLane = 16, kMaxExperts = kMaxExpertsPerLane * kWarp;
static_assert(kMaxExperts == kMaxRoutedExperts);

// The largest of a lane's values and its place (the lowest place among equals: places ascend with
// expert ids), pairs of neighbouring ranges combined level by level.
template <int P>
__device__ __forceinline__ void lane_best(const float (&q)[P], float& best, int& at) {
  float v[P];
  int place[P];
#pragma unroll
  for (int i = 0; i < P; ++i) v[i] = q[i], place[i] = i;
#pragma unroll
  for (int width = P / 2; width >= 1; width /= 2)
#pragma unroll
    for (int j = 0; j < width; ++j) {
      const bool right = v[2 * j + 1] > v[2 * j];  // strictly greater: the lower expert stays
      place[j] = right ? place[2 * j + 1] : place[2 * j];
      v[j] = right ? v[2 * j + 1] : v[2 * j];
    }
  best = v[0], at = place[0];
}

struct RouteSlot {
  int expert = 0;
  float weight = 0.0f;
};

template <int P>
__device__ RouteSlot route_one_token(const float* logits, int n, int k, int lane) {
  float p[P];
  float big = -INFINITY;
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int e = lane + kWarp * i;
    p[i] = e < n ? __ldcg(logits + e) : -INFINITY;
    big = fmaxf(big, p[i]);
  }
  big = warp_max(big);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < P; ++i) {
    if (lane + kWarp * i >= n) continue;
    p[i] = expf(p[i] - big);
    sum += p[i];
  }
  sum = warp_sum(sum);
  // Probabilities; -1 for experts past n, NaN ones (never chosen) and, later, the taken ones.
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const float prob = lane + kWarp * i < n ? p[i] / sum : -1.0f;
    p[i] = prob >= 0.0f ? prob : -1.0f;
  }
  float chosen_sum = 0.0f, mine = 0.0f;  // mine, my_expert: slot `lane`'s choice
  int my_expert = 0;
  for (int slot = 0; slot < k; ++slot) {
    float best;
    int at;
    lane_best(p, best, at);
    const unsigned key = best >= 0.0f ? __float_as_uint(best) + 1u : 0u;  // 0: nothing left (NaN logits)
    const unsigned top = __reduce_max_sync(0xffffffffu, key);
    const unsigned chosen = __reduce_min_sync(0xffffffffu, key == top && top ? unsigned(lane + kWarp * at) : 0xffffffffu);
    const int e = top ? int(chosen) : slot;  // NaN logits: stay inside the table
    const float value = top ? __uint_as_float(top - 1u) : -1.0f;
    if (top && lane == e % kWarp)
#pragma unroll
      for (int i = 0; i < P; ++i)
        if (i == e / kWarp) p[i] = -1.0f;  // taken
    if (lane == slot) mine = value, my_expert = e;
    chosen_sum += value;
  }
  return {my_expert, mine / chosen_sum};
}

// Lane s < k writes slot s (no lane waits on another's stores and loads), its expert at ids[s] and
// its up half at ids[up + s], and counts it in the tally, whose flags are read from `resident`
// (the tally's, or a copy in shared memory).
__device__ __forceinline__ void write_route(RouteSlot slot, int lane, int n, int k, int32_t* ids, int up,
                                            float* weights, RouteTally tally, const uint8_t* resident) {
  if (lane >= k) return;
  ids[lane] = slot.expert;
  ids[up + lane] = slot.expert + n;
  weights[lane] = slot.weight;
  if (tally.counts) {
    atomicAdd(tally.counts + slot.expert, 1u);
    if (!resident[slot.expert]) atomicAdd(tally.misses, 1u);
  }
}

// Block t routes row t: its logits logits_stride apart, its choices ids_stride apart with their up
// halves `up` after them (a prompt chunk's [n][2k]: 2k and k; a window's: k and n k).
template <int P>
__global__ void moe_route_kernel(const float* logits, int64_t logits_stride, int n, int k, int32_t* ids,
                                 int ids_stride, int up, float* weights, RouteTally tally) {
  begin_after_inputs();
  const RouteSlot slot = route_one_token<P>(logits + int64_t(blockIdx.x) * logits_stride, n, k, int(threadIdx.x));
  write_route(slot, int(threadIdx.x), n, k, ids + int64_t(blockIdx.x) * ids_stride, up,
              weights + int64_t(blockIdx.x) * k, tally, tally.resident);
}

// expert_groups: the pairs' ids into shared memory, each expert's pairs counted (shared atomics),
// each expert's first group from a scan over the experts (thread t holds a run of them: a warp's
// scan by shuffles, then the warps' totals), then each pair placed in its expert's groups by one
// warp, 32 pairs a pass, and the rest of the groups empty. (With thread 0 adding up the experts one
// after another and every thread counting by a pass over all the pairs, the kernel table of a step
// of 16 sequences booked it 10.7 us a layer on an H100; 8.9 since the scan, and 19.3 at 64
// sequences, while each expert's thread went through every pair for its own.)
constexpr int kGroupThreads = 256;

// The block's exclusive scan of one value a thread (kThreads of them), and the total (in every
// thread).
template <int kThreads>
__device__ unsigned block_exclusive_scan(unsigned v, unsigned& total) {
  __shared__ unsigned warp_sums[kThreads / kWarp];
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
  unsigned sum = v;
  for (int o = 1; o < kWarp; o *= 2) {
    const unsigned up = __shfl_up_sync(0xffffffffu, sum, o);
    if (lane >= o) sum += up;
  }
  if (lane == kWarp - 1) warp_sums[warp] = sum;
  __syncthreads();
  unsigned before = sum - v;
  total = 0;
  for (int w = 0; w < kThreads / kWarp; ++w) {
    if (w < warp) before += warp_sums[w];
    total += warp_sums[w];
  }
  __syncthreads();  // (warp_sums free for the next call)
  return before;
}

__global__ void __launch_bounds__(kGroupThreads)
    expert_groups_kernel(const int32_t* ids, int pairs, int n_experts, int most, ExpertGroup* groups,
                         const uint8_t* resident, unsigned* absent_groups) {
  __shared__ int32_t id[kMaxGroupPairs];
  __shared__ int32_t count[kMaxExperts];
  __shared__ int32_t first[kMaxExperts];   // expert e's first group
  __shared__ int32_t placed[kMaxExperts];  // expert e's pairs placed so far
  begin_after_inputs();
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    id[p] = ids[p];
    if (unsigned(id[p]) < unsigned(n_experts)) atomicAdd(&count[id[p]], 1);
  }
  __syncthreads();
  // Thread t's experts: [t per, (t + 1) per).
  const int per = (n_experts + kGroupThreads - 1) / kGroupThreads, begin = int(threadIdx.x) * per;
  const int end = min(n_experts, begin + per);
  int mine = 0, mine_absent = 0;
  for (int e = begin; e < end; ++e) {
    const int groups_of_e = (count[e] + most - 1) / most;
    mine += groups_of_e;
    if (absent_groups && !resident[e]) mine_absent += groups_of_e;
  }
  unsigned all = 0;
  if (absent_groups) {
    unsigned absent = 0;
    block_exclusive_scan<kGroupThreads>(unsigned(mine_absent), absent);
    if (threadIdx.x == 0 && absent) atomicAdd(absent_groups, absent);
  }
  int next = int(block_exclusive_scan<kGroupThreads>(unsigned(mine), all));
  for (int e = begin; e < end; ++e) first[e] = next, next += (count[e] + most - 1) / most, placed[e] = 0;
  __syncthreads();
  // Each pair's place among its expert's pairs, in pair order, by warp 0, 32 pairs at a time: the
  // lanes of one expert (match_any) come after the pairs placed before and the lanes below them.
  if (threadIdx.x < kWarp) {
    const int lane = int(threadIdx.x);
    for (int c = 0; c < pairs; c += kWarp) {
      const int p = c + lane, e = p < pairs ? id[p] : -1;
      const bool valid = unsigned(e) < unsigned(n_experts);
      const unsigned same = __match_any_sync(0xffffffffu, valid ? e : -1);
      if (valid) {
        const int at = placed[e] + __popc(same & ((1u << lane) - 1u));
        ExpertGroup& g = groups[first[e] + at / most];
        g.pairs[at % most] = p;
        if (at % most == 0) g.id = e, g.count = min(most, count[e] - at);
      }
      __syncwarp();
      if (valid && lane == 31 - __clz(same)) placed[e] += __popc(same);  // (the set's highest lane)
      __syncwarp();
    }
  }
  for (int g = int(all) + int(threadIdx.x); g < pairs; g += blockDim.x) groups[g].id = -1, groups[g].count = 0;
}

// The fewest experts a lane holds (a power of two) for n experts, as launch(P).
template <class Launch>
cudaError_t with_experts_per_lane(int n, Launch&& launch) {
  return with_fewest_per_unit<kMaxExpertsPerLane>(n, kWarp, launch);
}

// The router's float32 product and the top k in one launch: each warp dots a row of w with x (both
// read as float4 through the caches), and the last block to finish (counted in *arrivals, which it
// resets) routes. Rows past n_experts (the shared expert's gate) are products only. A lane holds
// up to kRouterLoads float4 of its row in registers, streaming (read once a step: FromGlobal in
// cuda/q8_slices.cuh), loaded before the wait for x (the weights do not depend on the kernel
// before), in passes of that many for wider rows (their rest asked of L2 before the wait too). The
// tally's residency flags, which the choices look up, are loaded before the wait as well (no kernel
// of the step writes them) and the last block copies them into shared memory, so no trip to memory
// follows the choice on the step's chain (on the H200, the 35B synth: 495.8-496.8 tokens/s against
// 489.1-493.5 reading them after the choice).
constexpr int kRouterWarps = 4, kRouterLoads = 16;

// A window's rows (kernels::TokenRows) come rows_at to a block (blockIdx.y: rows rows_at y ..),
// which dots its weight rows, held in registers (one pass: rows of up to 2,048 values), with each of
// them in turn, so the router matrix is read once a block rather than once a row; each row reads its
// x and writes its logits, choices and weights at its own places, as moe_route_window lays them out,
// and the blocks of rows rows_at y .. count in arrivals[y]. Every row's logits are the bits one
// row's launch gives.
//
// rows_at: an eighth of the rows, from 2 to 8. A block dots its rows one after another and its last
// to arrive routes them, a row a warp, so few rows a block shorten the chain, while each block reads
// the matrix again (from L2). On an H100, the 35B synth, lode bench --sequences 16,64 (ms a step,
// two runs each, 8 / 4 / 2 / 1 rows a block): 16 sequences 9.100, 9.088 / 8.892, 8.795 / 8.779,
// 8.771 / 9.005, 8.973; 64 sequences 24.797, 24.589 / 24.969, 24.624 / 24.994, 24.962 / 25.216,
// 25.287.
int router_rows_per_block(int rows) { return std::clamp((rows + 7) / 8, 2, 8); }

template <int P>
__global__ void __launch_bounds__(kRouterWarps * kWarp)
    router_topk_kernel(const float* w, int rows, int cols, const float* x, float* logits, int n_experts, int k,
                       int32_t* ids, float* weights, RouteTally tally, unsigned* arrivals, kernels::TokenRows window,
                       int rows_at) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, t0 = int(blockIdx.y) * rows_at;
  const int rows_here = min(rows_at, window.n - t0);
  arrivals += blockIdx.y;
  const int r = min(int(blockIdx.x) * kRouterWarps + warp, rows - 1);  // past the end: the last row, not stored
  const float4* wr = reinterpret_cast<const float4*>(w + int64_t(r) * cols);
  const int n4 = cols / 4;
  float4 a[kRouterLoads];
  const auto load = [&](int pass_begin) {
#pragma unroll
    for (int j = 0; j < kRouterLoads; ++j)
      if (pass_begin + lane + kWarp * j < n4) a[j] = __ldcs(wr + pass_begin + lane + kWarp * j);
  };
  load(0);
  const bool one_pass = n4 <= kWarp * kRouterLoads;
  if (!one_pass)  // a row wider than one pass: the rest on its way to L2
    prefetch_lines(wr + kWarp * kRouterLoads, int64_t(n4 - kWarp * kRouterLoads) * 16, lane, kWarp);
  // Thread t holds flags t + 128 j.
  constexpr int kThreads = kRouterWarps * kWarp, kFlagsEach = (P * kWarp + kThreads - 1) / kThreads;
  const auto at = [&](int j) { return int(threadIdx.x) + kThreads * j; };
  uint8_t flags[kFlagsEach];
#pragma unroll
  for (int j = 0; j < kFlagsEach; ++j) flags[j] = tally.counts && at(j) < n_experts ? __ldcg(tally.resident + at(j)) : 0;
  begin_after_inputs();
  for (int u = 0; u < rows_here; ++u) {
    const float4* xv = reinterpret_cast<const float4*>(x + (t0 + u) * window.in_stride);
    float sum = 0.0f;
    for (int pass_begin = 0; pass_begin < n4; pass_begin += kWarp * kRouterLoads) {
      if (pass_begin > 0 || (u > 0 && !one_pass)) load(pass_begin);
#pragma unroll
      for (int j = 0; j < kRouterLoads; ++j) {
        const int i = pass_begin + lane + kWarp * j;
        if (i >= n4) continue;
        const float4 b = xv[i];
        sum += a[j].x * b.x + a[j].y * b.y + a[j].z * b.z + a[j].w * b.w;
      }
    }
    sum = warp_sum(sum);
    if (lane == 0 && int(blockIdx.x) * kRouterWarps + warp < rows) logits[(t0 + u) * window.out_stride + r] = sum;
  }
  if (!last_to_arrive(arrivals, gridDim.x)) return;
  __shared__ uint8_t resident[P * kWarp];
#pragma unroll
  for (int j = 0; j < kFlagsEach; ++j)
    if (at(j) < P * kWarp) resident[at(j)] = flags[j];
  // Warp w routes rows w, w + 4, ...; its first choice made while the flags are copied.
  const auto choose = [&](int u) { return route_one_token<P>(logits + (t0 + u) * window.out_stride, n_experts, k, lane); };
  RouteSlot slot;
  if (warp < rows_here) slot = choose(warp);
  __syncthreads();
  for (int u = warp; u < rows_here; u += kRouterWarps) {
    if (u != warp) slot = choose(u);
    const int t = t0 + u;
    write_route(slot, lane, n_experts, k, ids + t * k, window.n * k, weights + t * k, tally, resident);
  }
  if (threadIdx.x == 0) *arrivals = 0;
}

// A (value, index) candidate for the greedy token: a negative index is none. `better` orders
// them: the larger value, then the lower index.
struct Candidate {
  float value;
  int index;
};
__device__ __forceinline__ bool better(Candidate a, Candidate b) {
  return a.index >= 0 && (b.index < 0 || a.value > b.value || (a.value == b.value && a.index < b.index));
}
__device__ Candidate best_in_block(Candidate c) {
  __shared__ Candidate warps_best[32];
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const Candidate o{__shfl_xor_sync(0xffffffffu, c.value, offset), __shfl_xor_sync(0xffffffffu, c.index, offset)};
    if (better(o, c)) c = o;
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();  // warps_best free from an earlier call
  if (lane == 0) warps_best[warp] = c;
  __syncthreads();
  c = lane < int(blockDim.x / kWarp) ? warps_best[lane] : Candidate{0.0f, -1};
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const Candidate o{__shfl_xor_sync(0xffffffffu, c.value, offset), __shfl_xor_sync(0xffffffffu, c.index, offset)};
    if (better(o, c)) c = o;
  }
  return c;  // in every lane of every warp
}

// Partials' index for a block that saw a NaN or +inf logit.
constexpr int kBadLogits = -2;

// Row t (blockIdx.y) of a window: its logits, partials, counter and token its own.
__global__ void greedy_token_kernel(const float* logits, int n, Candidate* partials, unsigned* arrivals,
                                    int32_t* token) {
  begin_after_inputs();
  const int t = blockIdx.y;
  logits += int64_t(t) * n, partials += t * gridDim.x, arrivals += t, token += t;
  Candidate c{0.0f, -1};
  bool bad = false;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float v = logits[i];
    if (isnan(v) || v == INFINITY) bad = true;
    else if (v != -INFINITY && (c.index < 0 || v > c.value)) c = {v, i};  // i rises: the first of equals stays
  }
  bad = __syncthreads_or(bad);
  c = best_in_block(c);
  if (threadIdx.x == 0) partials[blockIdx.x] = bad ? Candidate{0.0f, kBadLogits} : c;
  if (!last_to_arrive(arrivals, gridDim.x)) return;
  c = Candidate{0.0f, -1};
  bad = false;
  for (int b = threadIdx.x; b < int(gridDim.x); b += blockDim.x) {
    const Candidate o{__ldcg(&partials[b].value), __ldcg(&partials[b].index)};
    bad = bad || o.index == kBadLogits;
    if (better(o, c)) c = o;
  }
  bad = __syncthreads_or(bad);
  c = best_in_block(c);
  if (threadIdx.x == 0) {
    *token = bad || c.index < 0 ? -1 : c.index;
    *arrivals = 0;
  }
}

// top_candidates: each row cut into slices, a block each; a block selects its slice's k best
// into the scratch, and the last of a row's blocks to finish selects the row's k best from theirs.
// A slice's k best hold every one of the row's k best that lies in it, so the two selections give
// the row's. (One block a row had read the row four or five times on one multiprocessor: on an
// H100, the 35B synth, `lode run --temp 0.7` 373-375 tokens/s against greedy's 437-444; with the
// slices 427-432 in the same call.)
//
// The order is a composite key of 64 bits: the logit's order key (which orders like the logit, -0
// as +0, so those tie), then the index complemented, so the lower index ranks higher among equal
// logits; every candidate's key is distinct, and a logit that is no candidate (NaN, +-inf) has key
// 0, under every candidate's. A radix select finds the k-th best key digit by digit, each pass a
// histogram of the keys that match the digits found so far, and stops at the first digit whose
// chosen bin holds exactly as many keys as are still needed: those and the keys above them are the
// k best.
constexpr int kTopThreads = 256, kTopBins = 4096;
// The digits' widths from the top, 12, 10, 10, 11, 11, 10: the logit's 32 bits (a first digit of 12
// spreads the logits' few exponents over many bins), then the index's.
constexpr int kTopDigits = 6;
__device__ __forceinline__ int top_digit_bits(int d) { return d == 0 ? 12 : d < 3 || d == 5 ? 10 : 11; }

__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Whether a logit takes part: finite or -inf are the sampler's; -inf never is a candidate.
__device__ __forceinline__ bool candidate_logit(float v) { return v != -INFINITY && v < INFINITY; }

__device__ __forceinline__ uint64_t top_key(float v, int32_t id) {
  return candidate_logit(v) ? uint64_t(order_key(v)) << 32 | uint32_t(~id) : 0;
}

// The selection's state, the same in every thread: the digits chosen so far (prefix, under mask),
// and how many keys of the k best lie at or under them.
struct TopSelect {
  uint64_t prefix = 0, mask = 0;
  unsigned need = 0;
};

// One pass: the histogram of the digit of `bits` at `shift` over the keys that match the prefix,
// then the digit where the count from the top reaches `need`. Thread t sums the bins ranked
// [t per, t per + per) from the top; the one whose bins hold the crossing names it. Returns how
// many keys the chosen bin holds.
template <class KeyOf>
__device__ unsigned top_pass(int m, KeyOf key_of, int shift, int bits, TopSelect& s, unsigned* hist) {
  __shared__ uint64_t chosen_prefix;
  __shared__ unsigned chosen_need, chosen_count;
  const int bins = 1 << bits, per = bins / kTopThreads;
  for (int b = threadIdx.x; b < bins; b += kTopThreads) hist[b] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < m; i += kTopThreads) {
    const uint64_t key = key_of(i);
    if ((key & s.mask) == s.prefix) atomicAdd(&hist[int(key >> shift) & (bins - 1)], 1u);
  }
  __syncthreads();
  const int top = bins - 1 - int(threadIdx.x) * per;  // this thread's bins: top, top - 1, ...
  unsigned mine = 0;
  for (int j = 0; j < per; ++j) mine += hist[top - j];
  unsigned total;
  unsigned above = block_exclusive_scan<kTopThreads>(mine, total);
  if (above < s.need && above + mine >= s.need) {
    for (int j = 0; j < per; ++j) {
      const unsigned c = hist[top - j];
      if (above + c >= s.need) {
        chosen_prefix = s.prefix | uint64_t(top - j) << shift, chosen_need = s.need - above, chosen_count = c;
        break;
      }
      above += c;
    }
  }
  __syncthreads();
  s.prefix = chosen_prefix, s.need = chosen_need, s.mask |= uint64_t(bins - 1) << shift;
  const unsigned in_bin = chosen_count;
  __syncthreads();  // (the shared values free for the next pass)
  return in_bin;
}

// The k best of m keys (k < the keys that are not 0; distinct): afterwards exactly k keys satisfy
// (key & s.mask) >= s.prefix.
template <class KeyOf>
__device__ TopSelect select_top(int m, int k, KeyOf key_of, unsigned* hist) {
  TopSelect s;
  s.need = unsigned(k);
  int shift = 64;
  for (int d = 0; d < kTopDigits; ++d) {
    shift -= top_digit_bits(d);
    const unsigned in_bin = top_pass(m, key_of, shift, top_digit_bits(d), s, hist);
    if (in_bin == s.need) break;
  }
  return s;
}

// Writes the k best of m keys (every key that is not 0 where there are no more than k: `valid`)
// through put(i, slot), each once, slots 0.. in no particular order. Returns how many.
template <class KeyOf, class Put>
__device__ int take_top(int m, int k, unsigned valid, KeyOf key_of, Put put, unsigned* hist) {
  __shared__ unsigned slots;
  TopSelect s;  // with no more than k valid keys, every key over 0
  s.mask = ~uint64_t(0), s.prefix = 1;
  if (valid > unsigned(k)) s = select_top(m, k, key_of, hist);
  if (threadIdx.x == 0) slots = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < m; i += kTopThreads)
    if ((key_of(i) & s.mask) >= s.prefix) put(i, int(atomicAdd(&slots, 1u)));
  __syncthreads();
  return int(min(valid, unsigned(k)));
}

// Block (s, r): row r's slice s of `len` logits. The scratch: slices' pairs [rows][slices][k], their
// counts [rows][slices][2] (candidates written; finite logits, or -1 for a NaN or +inf), a counter
// a row (kept zeroed).
__global__ void __launch_bounds__(kTopThreads) top_candidates_kernel(const float* logits, int n, int k, TopScratch scratch,
                                                                       TopPair* out, int32_t* finite_out) {
  begin_after_inputs();
  __shared__ unsigned hist[kTopBins];
  __shared__ unsigned finite, bad;
  const int slices = scratch.slices, s = blockIdx.x, row = blockIdx.y;
  const int len = (n + slices - 1) / slices, first = s * len, m = max(0, min(n, first + len) - first);
  const float* x = logits + int64_t(row) * n + first;
  TopPair* slice_pairs = scratch.pairs + (int64_t(row) * slices + s) * k;
  int32_t* counts = scratch.counts + int64_t(row) * slices * 2;
  if (threadIdx.x == 0) finite = 0, bad = 0;
  __syncthreads();
  unsigned mine = 0, broken = 0;
  for (int i = threadIdx.x; i < m; i += kTopThreads) {
    const float v = x[i];
    broken |= isnan(v) || v == INFINITY;
    mine += candidate_logit(v);
  }
  atomicAdd(&finite, mine);
  if (broken) atomicOr(&bad, 1u);
  __syncthreads();
  const auto slice_key = [&](int i) { return top_key(x[i], first + i); };
  const int taken = take_top(m, k, finite, slice_key, [&](int i, int slot) { slice_pairs[slot] = {first + i, x[i]}; }, hist);
  if (threadIdx.x == 0) counts[2 * s] = taken, counts[2 * s + 1] = bad ? -1 : int32_t(finite);
  if (!last_to_arrive(scratch.arrivals + row, unsigned(slices))) return;
  // The row's k best of its slices' candidates.
  __shared__ unsigned row_finite, row_bad, candidates;
  if (threadIdx.x == 0) row_finite = 0, row_bad = 0, candidates = 0;
  __syncthreads();
  for (int t = threadIdx.x; t < slices; t += kTopThreads) {
    const int32_t c = __ldcg(&counts[2 * t]), f = __ldcg(&counts[2 * t + 1]);
    atomicAdd(&candidates, unsigned(c));
    if (f < 0) atomicOr(&row_bad, 1u);
    else atomicAdd(&row_finite, unsigned(f));
  }
  __syncthreads();
  const TopPair* pairs = scratch.pairs + int64_t(row) * slices * k;
  const auto pair_key = [&](int i) {
    if (i % k >= __ldcg(&counts[2 * (i / k)])) return uint64_t(0);
    const TopPair p{__ldcg(&pairs[i].id), __ldcg(&pairs[i].logit)};
    return top_key(p.logit, p.id);
  };
  out += int64_t(row) * k;
  take_top(slices * k, k, candidates, pair_key,
           [&](int i, int slot) { out[slot] = {__ldcg(&pairs[i].id), __ldcg(&pairs[i].logit)}; }, hist);
  if (threadIdx.x == 0) {
    finite_out[row] = row_bad ? -1 : int32_t(row_finite);
    scratch.arrivals[row] = 0;
  }
}

// Row r (a block): its ids set aside, a thread each (distinct ids: no two threads meet).
__global__ void set_aside_kernel(float* logits, int n, const int32_t* ids, const int32_t* counts, int cap, float* out) {
  begin_after_inputs();
  const int r = blockIdx.x, count = min(counts[r], cap);
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const int32_t id = ids[r * cap + i];
    if (id < 0 || id >= n) continue;  // (the host checked them)
    float& logit = logits[int64_t(r) * n + id];
    out[r * cap + i] = logit;
    logit = -INFINITY;
  }
}

__global__ void swiglu_kernel(const float* g, const float* u, float* h, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) h[i] = exact::swiglu(g[i], u[i]);
}

// The experts' outputs a thread loads at once (kPer values of each): 8 experts for up to 2 values a
// thread, 4 for 4, 1 for 8 (more would spill at 1024 threads' 64 registers).
template <int kPer>
constexpr int kSumExperts = kPer <= 2 ? 8 : kPer == 4 ? 4 : 1;

template <int kPer>
__global__ void __launch_bounds__(kNormThreads)
    moe_combine_add_norm_kernel(const float* y, const float* weights, int k, const float* shared,
                                const float* shared_logit, int64_t logit_stride, int hidden, float* h,
                                const float* norm_w, float* normed, float eps) {
  constexpr int kAtOnce = kSumExperts<kPer>;
  float w[kPer];
  norm_weights<kPer>(norm_w, hidden, w);
  const int64_t t = blockIdx.x;  // a window's row
  y += t * k * hidden, weights += t * k, h += t * hidden, normed += t * hidden;
  if (shared) shared += t * hidden, shared_logit += t * logit_stride;
  wait_for_inputs();
  int at[kPer];
  float before[kPer], from_shared[kPer], o[kPer];
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    at[r] = min(norm_index(r), hidden - 1);
    before[r] = h[at[r]];
    from_shared[r] = shared ? shared[at[r]] : 0.0f;
    o[r] = 0.0f;  // moe_combine_kernel's sum: slot order
  }
  for (int j0 = 0; j0 < k; j0 += kAtOnce) {
    float gate[kAtOnce], out[kAtOnce][kPer];
#pragma unroll
    for (int jj = 0; jj < kAtOnce; ++jj) {
      const bool in = j0 + jj < k;
      gate[jj] = in ? weights[j0 + jj] : 0.0f;
#pragma unroll
      for (int r = 0; r < kPer; ++r) out[jj][r] = in ? y[int64_t(j0 + jj) * hidden + at[r]] : 0.0f;
    }
#pragma unroll
    for (int jj = 0; jj < kAtOnce; ++jj)
#pragma unroll
      for (int r = 0; r < kPer; ++r)
        if (j0 + jj < k) o[r] += gate[jj] * out[jj][r];
  }
  float v[kPer];
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    if (shared) o[r] += sigmoidf(*shared_logit) * from_shared[r];
    v[r] = before[r] + o[r];  // add_rms_norm_kernel's arithmetic from here
  }
  const float s = store_residual<kPer>(v, hidden, h);
  let_next_start_once(s);
  if (norm_w) write_normed<kPer>(v, w, rsqrtf(block_sum(s) / float(hidden) + eps), hidden, normed);
}

}  // namespace

const char* rms_norm(const float* x, const float* w, float* out, int rows, int n, float eps, void* stream,
                     const float* w_odd) {
  return error_text(launch_overlapped(rms_norm_kernel, dim3(rows), dim3(256), 0, stream, x, w, w_odd, out, n, eps));
}

const char* mtp_window_rows(const float* embedded, const float* states, int n, int hidden, MtpRowPlaces places,
                            float* rows, int32_t* sequences, int64_t* kv_rows, int64_t* shifts, void* stream) {
  if (n < 1 || n > 65535) return "MTP rows: 1 to 65535 of them";
  return error_text(launch_overlapped(mtp_window_rows_kernel, dim3(n), dim3(256), 0, stream, embedded, states, hidden,
                                      places, rows, sequences, kv_rows, shifts));
}

const char* window_kept(const int32_t* greedy, const WindowTokens& window, int32_t* kept, void* stream) {
  if (window.n < 1 || window.n > kMaxWindowTokens) return "window_kept: 1 to 16 tokens";
  return error_text(launch_overlapped(window_kept_kernel, dim3(1), dim3(1), 0, stream, greedy, window, kept));
}

const char* mtp_continued_row(const int32_t* kept, const float* states, const int32_t* drafts, int hidden,
                              MtpRowPlaces places, float* row, int32_t* id, int32_t* sequences, int64_t* kv_rows,
                              int64_t* shifts, void* stream) {
  return error_text(launch_overlapped(mtp_continued_row_kernel, dim3(1), dim3(256), 0, stream, kept, states, drafts,
                                      hidden, places, row, id, sequences, kv_rows, shifts));
}

const char* add_rms_norm(float* h, const float* d, const float* w, float* out, int rows, int n, float eps,
                         void* stream) {
  if (n > kMaxNormed) return "residual and norm: rows wider than 8,192 values";
  return error_text(with_values_per_thread(n, [&](auto per) {
    return launch_overlapped(add_rms_norm_kernel<decltype(per)::value>, dim3(rows), dim3(kNormThreads), 0, stream, h,
                             d, w, out, n, eps);
  }));
}

const char* attention_prepare(float* qg, float* k, const float* v, const float* q_norm, const float* k_norm,
                              KvView kv, const int64_t* pos, int n_heads, int n_kv_heads, int head_dim, int rope_dims,
                              double rope_theta, float eps, int n_tokens, void* stream, int64_t stacked_stride,
                              const int64_t* rotary_shift) {
  if (head_dim > kKvMaxHeadDim) return "head_dim over 512";
  const dim3 grid(n_heads + n_kv_heads, n_tokens);
  return with_stores(kv.format, [&](auto stores) {
    using S = decltype(stores);
    return error_text(launch_overlapped(attention_prepare_kernel<S::k, S::v>, grid, dim3(128), 0, stream, qg, k, v,
                                        q_norm, k_norm, kv, pos, n_heads, head_dim, rope_dims, rope_theta, eps,
                                        stacked_stride, rotary_shift));
  });
}

const char* kv_write(KvView kv, const float* k, const float* v, int64_t first, int n_tokens, int heads, int head_dim,
                     void* stream) {
  if (head_dim > kKvMaxHeadDim) return "head_dim over 512";
  if (n_tokens <= 0) return nullptr;
  return with_stores(kv.format, [&](auto stores) {
    using S = decltype(stores);
    kv_write_kernel<S::k, S::v><<<dim3(heads, n_tokens), 128, 0, as_stream(stream)>>>(kv, k, v, first, heads, head_dim);
    return launched();
  });
}

const char* deltanet_prepare(float* qkv, float* conv_state, const float* conv_w, int channels, int kernel, int hk,
                             int dk, void* stream, TokenRows tokens) {
  if (dk > 1024) return "DeltaNet key heads wider than 1024";
  if (kernel < 1 || kernel > kMaxConvTaps) return "DeltaNet conv kernels of 1 to 8 taps only";
  if (tokens.n < 1) return "a DeltaNet conv of no tokens";
  const int threads = (dk + kWarp - 1) / kWarp * kWarp;
  const auto kernel_for = tokens.n == 1 ? conv_l2_kernel<false> : conv_l2_kernel<true>;
  return error_text(launch_overlapped(kernel_for, dim3((channels + dk - 1) / dk, run_blocks(tokens)), dim3(threads), 0,
                                      stream, qkv,
                                      conv_state, conv_w, channels, kernel, hk, dk, tokens));
}

const char* l2_norm_heads(float* qkv, int hk, int dk, int channels, int n_tokens, void* stream) {
  l2_norm_heads_kernel<<<dim3(2 * hk, n_tokens), 128, 0, as_stream(stream)>>>(qkv, hk, dk, channels);
  return launched();
}

const char* deltanet_step_refuses(int dk, int dv) {
  if (dk > kStepMaxKeyDim || dv % 4 != 0 || dv > kStepMaxValueDim)
    return "DeltaNet heads the step kernel does not take (dk and dv at most 128, dv a multiple of 4)";
  return nullptr;
}

const char* deltanet_step(float* state, const float* qkv, const float* z, const float* b, const float* alpha,
                          const float* a, const float* dt_bias, const float* norm_w, int hk, int hv, int dk, int dv,
                          float eps, float* o, void* stream, TokenRows tokens) {
  if (const char* err = deltanet_step_refuses(dk, dv)) return err;
  if (tokens.n < 1) return "a DeltaNet step of no tokens";
  const int threads = (dv + kStepColumnsPerWarp - 1) / kStepColumnsPerWarp * kWarp;
  const auto kernel = tokens.n == 1 ? deltanet_step_kernel<false> : deltanet_step_kernel<true>;
  return error_text(launch_overlapped(kernel, dim3(hv, run_blocks(tokens)), dim3(threads), 0, stream, state, qkv, z, b, alpha, a, dt_bias,
                                      norm_w, hk, dk, dv, eps, o, tokens));
}

namespace {
// What the routing warp cannot take (null: nothing): more experts than its lanes hold, or k
// outside 1..min(32, n_experts).
const char* routing_refused(int n_experts, int k) {
  if (n_experts > kMaxExperts) return "more than 512 experts";
  if (k < 1 || k > kWarp || k > n_experts) return "the router chooses 1 to 32 experts, at most all of them";
  return nullptr;
}
}  // namespace

const char* router_topk(const float* w, int rows, int cols, const float* x, float* logits, int n_experts, int k,
                        int32_t* ids, float* weights, RouteTally tally, unsigned* arrivals, void* stream,
                        TokenRows window) {
  if (cols % 4 != 0 || rows < n_experts) return "router rows must be a multiple of 4 wide and hold every expert";
  if (const char* err = routing_refused(n_experts, k)) return err;
  if (window.n < 1 || window.n > 65535) return "a router window of 1 to 65535 rows";
  const int rows_at = router_rows_per_block(window.n);
  return error_text(with_experts_per_lane(n_experts, [&](auto per_lane) {
    return launch_overlapped(router_topk_kernel<decltype(per_lane)::value>,
                             dim3((rows + kRouterWarps - 1) / kRouterWarps, (window.n + rows_at - 1) / rows_at),
                             dim3(kRouterWarps * kWarp), 0,
                             stream, w, rows, cols, x, logits, n_experts, k, ids, weights, tally, arrivals, window,
                             rows_at);
  }));
}

namespace {
cudaError_t route_rows(const float* logits, int64_t logits_stride, int n_experts, int k, int n, int32_t* ids,
                       int ids_stride, int up, float* weights, RouteTally tally, void* stream) {
  return with_experts_per_lane(n_experts, [&](auto per_lane) {
    return launch_overlapped(moe_route_kernel<decltype(per_lane)::value>, dim3(n), dim3(kWarp), 0, stream, logits,
                             logits_stride, n_experts, k, ids, ids_stride, up, weights, tally);
  });
}
}  // namespace

const char* moe_route(const float* logits, int n_experts, int k, int n_tokens, int32_t* ids, float* weights,
                      RouteTally tally, void* stream) {
  if (const char* err = routing_refused(n_experts, k)) return err;
  return error_text(route_rows(logits, n_experts, n_experts, k, n_tokens, ids, 2 * k, k, weights, tally, stream));
}

const char* moe_route_window(const float* logits, int64_t logits_stride, int n_experts, int k, int n, int32_t* ids,
                             float* weights, RouteTally tally, void* stream) {
  if (const char* err = routing_refused(n_experts, k)) return err;
  return error_text(route_rows(logits, logits_stride, n_experts, k, n, ids, k, n * k, weights, tally, stream));
}

const char* expert_groups(const int32_t* ids, int pairs, int n_experts, int most, ExpertGroup* groups, void* stream,
                          const uint8_t* resident, unsigned* absent_groups) {
  if (pairs < 1 || pairs > kMaxGroupPairs) return "expert groups of 1 to 1024 pairs";
  if (n_experts < 1 || n_experts > kMaxExperts) return "expert groups of 1 to 512 experts";
  if (most < 1 || most > kGroupInputs) return "expert groups of 1 to 8 pairs each";
  if (absent_groups && !resident) return "expert groups: counting absent groups needs the residency flags";
  return error_text(launch_overlapped(expert_groups_kernel, dim3(1), dim3(kGroupThreads), 0, stream, ids, pairs,
                                      n_experts, most, groups, resident, absent_groups));
}

const char* greedy_token(const float* logits, int n, void* partials, int blocks, unsigned* arrivals, int32_t* token,
                         void* stream, int rows) {
  if (n < 1 || blocks < 1) return "greedy sampling needs at least one logit and one block";
  if (rows < 1 || rows > 65535) return "greedy sampling of 1 to 65535 rows";
  return error_text(launch_overlapped(greedy_token_kernel, dim3(blocks, rows), dim3(256), 0, stream, logits, n,
                                      static_cast<Candidate*>(partials), arrivals, token));
}

const char* top_candidates(const float* logits, int n, int k, TopScratch scratch, TopPair* out, int32_t* finite,
                           void* stream, int rows) {
  if (n < 1 || k < 1) return "top candidates need at least one logit and one candidate";
  if (rows < 1 || rows > 65535) return "top candidates of 1 to 65535 rows";
  if (scratch.slices < 1 || scratch.slices > 65535) return "top candidates over 1 to 65535 slices";
  return error_text(launch_overlapped(top_candidates_kernel, dim3(scratch.slices, rows), dim3(kTopThreads), 0, stream,
                                      logits, n, k, scratch, out, finite));
}

const char* set_aside(float* logits, int n, const int32_t* ids, const int32_t* counts, int cap, float* out,
                      void* stream, int rows) {
  if (n < 1 || cap < 1) return "setting aside logits needs at least one logit and room for one id";
  if (rows < 1 || rows > 65535) return "setting aside logits of 1 to 65535 rows";
  return error_text(
      launch_overlapped(set_aside_kernel, dim3(rows), dim3(256), 0, stream, logits, n, ids, counts, cap, out));
}

const char* swiglu(const float* g, const float* u, float* h, int64_t n, void* stream) {
  swiglu_kernel<<<blocks_for(n, 256), 256, 0, as_stream(stream)>>>(g, u, h, n);
  return launched();
}

const char* moe_combine_add_norm(const float* y, const float* weights, int k, const float* shared,
                                 const float* shared_logit, int hidden, float* h, const float* norm_w, float* normed,
                                 float eps, void* stream, int rows, int64_t logit_stride) {
  if (hidden > kMaxNormed) return "expert sum and norm: rows wider than 8,192 values";
  if (rows < 1) return "expert sum and norm of no rows";
  return error_text(with_values_per_thread(hidden, [&](auto per) {
    return launch_overlapped(moe_combine_add_norm_kernel<decltype(per)::value>, dim3(rows), dim3(kNormThreads), 0,
                             stream, y, weights, k, shared, shared_logit, logit_stride, hidden, h, norm_w, normed, eps);
  }));
}

}  // namespace lode::cuda::kernels
