// Decode attention (cuda/forward_kernels.h's attention_decode): split-K over the paged cells, one
// block per (KV head's query heads, split), then a merge of the splits' partials. Two kernels share
// the split and the partials: the tensor-core kernel for stores whose codes fp16 holds exactly
// (fp16, int8, q4), and the float32 kernel for the rest.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "cuda/async_copy.cuh"
#include "cuda/forward_kernels.h"
#include "cuda/kernel_math.cuh"
#include "cuda/kv_cells.cuh"

namespace lode::cuda::kernels {

namespace {

constexpr int kAttentionWarps = 4;
constexpr int kAttentionGroup = 8;      // query heads per block of decode attention (of one KV head)
constexpr int kAttentionHeadDim = 256;  // decode attention's widest head: 8 values per lane
constexpr int kLoadsInFlight = 8;       // 8-value loads of a key row a lane issues before it uses them
constexpr int kValueRowsInFlight = 4;   // value rows whose loads a lane issues before it uses them

// Keys per split of decode attention: the keys shared evenly among the splits, but at least
// min_keys, and a multiple of 16 (so the tensor-core kernel's tiles of 16 keys never straddle a page).
__host__ __device__ inline int64_t keys_per_split(int64_t n_keys, int64_t n_splits, int min_keys) {
  const int64_t even = (n_keys + n_splits - 1) / n_splits;
  return ((even > min_keys ? even : min_keys) + 15) / 16 * 16;
}

// The fewest keys a split takes: the float32 kernel's block takes 4 tiles of 32 keys at once, the
// tensor-core kernel's a tile of 16 (a shallow split's warps share it).
constexpr int kFloatSplitKeys = 64;
constexpr int kTensorSplitKeys = 16;

// Block (b, split)'s share of decode attention: KV head kvh, query heads [h0, h0 + heads) (up to
// 8 of its group), keys [begin, end) of the positions [0, *position] (empty for a split past them),
// per_split keys a split.
struct BlockShare {
  int kvh, h0, heads;
  int64_t begin, end, per_split;
};

// (The block's row's place: row_place, whose page table the block then reads.)
__device__ BlockShare block_share(int n_heads, int n_kv_heads, int64_t position, int min_keys) {
  const int group = n_heads / n_kv_heads, blocks_per_kv = (group + kAttentionGroup - 1) / kAttentionGroup;
  const int kvh = int(blockIdx.x) / blocks_per_kv;
  const int h0 = kvh * group + int(blockIdx.x) % blocks_per_kv * kAttentionGroup;
  const int64_t n_all = position + 1, per_split = keys_per_split(n_all, gridDim.y, min_keys);
  const int64_t begin = int64_t(blockIdx.y) * per_split;
  return {kvh, h0, min(kAttentionGroup, (kvh + 1) * group - h0), begin, min(n_all, begin + per_split), per_split};
}

// Block (b, split, t) works for token t of a window (kernels::TokenRows) or row t of a step of
// several sequences (KvView::row_sequence): its query row qg + t q_stride, its partials after the
// earlier tokens' [n_heads][splits][head_dim + 2], its position and page table the row's (the
// kernel's KvView, a parameter, stays as it is: its other fields are read from parameter space).
__device__ __forceinline__ RowPlace to_token(const float*& qg, int64_t q_stride, float*& partials, const KvView& kv,
                                             const int64_t* position, int n_heads, int head_dim) {
  qg += int64_t(blockIdx.z) * q_stride;
  partials += int64_t(blockIdx.z) * n_heads * gridDim.y * (head_dim + 2);
  return row_place(kv, position, int(blockIdx.z));
}

// The block's partials from its warps' (max, sum, unnormalised output) per head (o: warp w's head g
// at o[(w * kAttentionGroup + g) * o_stride]): partial (h, split) = [max, sum, out[head_dim]], for
// attention_merge_kernel. Warps that saw no key have max -inf.
__device__ void write_partials(const float (*warp_m)[kAttentionGroup], const float (*warp_l)[kAttentionGroup],
                               const float* o, int o_stride, int h0, int heads, int head_dim, float* partials) {
  // Each head's max, sum and warp weights by a thread of its own, then every (head, dim) by the
  // block at once: weights computed once, not once per dim (the sums are the same, in the same order).
  __shared__ float weight[kAttentionWarps][kAttentionGroup];
  const auto partial = [&](int g) { return partials + (int64_t(h0 + g) * gridDim.y + blockIdx.y) * (head_dim + 2); };
  if (const int g = threadIdx.x; g < heads) {
    float big = -INFINITY, total = 0.0f;
    for (int w = 0; w < kAttentionWarps; ++w) big = fmaxf(big, warp_m[w][g]);
    for (int w = 0; w < kAttentionWarps; ++w) {
      weight[w][g] = warp_m[w][g] == -INFINITY ? 0.0f : expf(warp_m[w][g] - big);
      if (warp_m[w][g] != -INFINITY) total += warp_l[w][g] * weight[w][g];
    }
    partial(g)[0] = big, partial(g)[1] = total;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < heads * head_dim; e += blockDim.x) {
    const int g = e / head_dim, d = e % head_dim;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttentionWarps; ++w)
      if (warp_m[w][g] != -INFINITY) sum += o[(w * kAttentionGroup + g) * o_stride + d] * weight[w][g];
    partial(g)[2 + d] = sum;
  }
}

// q_g · (8 values) for the block's query heads, q in shared memory at dims [8c, 8c + 8).
__device__ __forceinline__ void add_scores(float (&s)[kAttentionGroup], const float (*q)[kAttentionHeadDim], int heads,
                                           int c, const float (&x)[8]) {
#pragma unroll
  for (int g = 0; g < kAttentionGroup; ++g) {
    if (g >= heads) break;
    const float4 a = *reinterpret_cast<const float4*>(&q[g][8 * c]);
    const float4 b = *reinterpret_cast<const float4*>(&q[g][8 * c + 4]);
    s[g] += a.x * x[0] + a.y * x[1] + a.z * x[2] + a.w * x[3] + b.x * x[4] + b.y * x[5] + b.z * x[6] + b.w * x[7];
  }
}

// The float32 kernel, for stores the tensor cores cannot read exactly (float32 sides) and head
// sizes other than 128 and 256. Split-K over the keys, grouped by KV head: block (b, split) takes up to 8 query heads of one KV
// head (so each K/V row is read once for all of them) and one contiguous share of the keys. Its
// warps take tiles of 32 keys in turn: each lane scores one key of the tile against every query
// head (its row read in 8-value chunks, kLoadsInFlight of them in flight), the tile updates each
// head's online softmax, and then each lane accumulates 8 dims of the value rows, key by key (the
// rows of kValueRowsInFlight keys in flight; the tile's weights and rows pass through shared
// memory). The warps merge, and the block leaves one partial (max,
// sum, unnormalised output) per query head for attention_merge_kernel. Splits past the keys leave
// an empty partial.
template <Store KS, Store VS>
__global__ void __launch_bounds__(kAttentionWarps * kWarp)
    attention_decode_kernel(const float* qg, KvView kv, const int64_t* position, int n_heads, int n_kv_heads,
                            int head_dim, float* partials, int64_t q_stride) {
  begin_after_inputs();
  const RowPlace place = to_token(qg, q_stride, partials, kv, position, n_heads, head_dim);
  const int32_t* pages = place.pages;
  const BlockShare share = block_share(n_heads, n_kv_heads, place.position, kFloatSplitKeys);
  const int kvh = share.kvh, h0 = share.h0, heads = share.heads;
  const int64_t begin = share.begin, end = share.end;
  if (begin >= end) return;  // a split past the keys: the merge does not read it
  __shared__ __align__(16) float q[kAttentionGroup][kAttentionHeadDim];
  __shared__ float warp_m[kAttentionWarps][kAttentionGroup], warp_l[kAttentionWarps][kAttentionGroup];
  __shared__ float warp_acc[kAttentionWarps][kAttentionGroup][kAttentionHeadDim];
  __shared__ __align__(16) float tile_p[kAttentionWarps][kWarp][kAttentionGroup];
  __shared__ const uint8_t* tile_v[kAttentionWarps][kWarp];
  for (int i = threadIdx.x; i < heads * head_dim; i += blockDim.x)
    q[i / head_dim][i % head_dim] = qg[int64_t(h0 + i / head_dim) * 2 * head_dim + i % head_dim];
  __syncthreads();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t row_values = int64_t(n_kv_heads) * head_dim, first = int64_t(kvh) * head_dim;
  const float scale = rsqrtf(float(head_dim));
  const int chunks = head_dim / 8;
  const bool owns_dims = lane < chunks;  // values: lane's dims [8 lane, 8 lane + 8)
  float m[kAttentionGroup], l[kAttentionGroup], acc[kAttentionGroup][8];
#pragma unroll
  for (int g = 0; g < kAttentionGroup; ++g) {
    m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
  }
  for (int64_t tile = begin + int64_t(warp) * kWarp; tile < end; tile += kAttentionWarps * kWarp) {
    const int n_tile = int(min(int64_t(kWarp), end - tile));
    const bool valid = lane < n_tile;
    const uint8_t* k_row = valid ? kv_row(kv.k, pages, tile + lane, kv.k_row_bytes) : nullptr;
    const uint8_t* v_row = valid ? kv_row(kv.v, pages, tile + lane, kv.v_row_bytes) : nullptr;
    float s[kAttentionGroup];
#pragma unroll
    for (int g = 0; g < kAttentionGroup; ++g) s[g] = 0.0f;
    if (valid)
      for (int c0 = 0; c0 < chunks; c0 += kLoadsInFlight) {
        float x[kLoadsInFlight][8];
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u)
          if (c0 + u < chunks) KvSide<KS>::load8(k_row, row_values, first + 8 * (c0 + u), x[u]);
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u)
          if (c0 + u < chunks) add_scores(s, q, heads, c0 + u, x[u]);
      }
    float p[kAttentionGroup];
#pragma unroll
    for (int g = 0; g < kAttentionGroup; ++g) {
      p[g] = 0.0f;
      if (g >= heads) continue;
      const float sg = valid ? s[g] * scale : -INFINITY;
      const float m_new = fmaxf(m[g], warp_max(sg));  // finite: the tile has a key
      const float old = expf(m[g] - m_new);
      p[g] = valid ? expf(sg - m_new) : 0.0f;
      l[g] = l[g] * old + warp_sum(p[g]);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] *= old;
      m[g] = m_new;
    }
    // The tile's weights and value rows, for every lane to read (broadcasts, not shuffles).
#pragma unroll
    for (int g = 0; g < kAttentionGroup; g += 4)
      *reinterpret_cast<float4*>(&tile_p[warp][lane][g]) = make_float4(p[g], p[g + 1], p[g + 2], p[g + 3]);
    tile_v[warp][lane] = v_row;
    __syncwarp();
    for (int k0 = 0; k0 < n_tile; k0 += kValueRowsInFlight) {
      float v[kValueRowsInFlight][8];
#pragma unroll
      for (int u = 0; u < kValueRowsInFlight; ++u)
        if (k0 + u < n_tile && owns_dims) KvSide<VS>::load8(tile_v[warp][k0 + u], row_values, first + 8 * lane, v[u]);
#pragma unroll
      for (int u = 0; u < kValueRowsInFlight; ++u) {
        if (k0 + u >= n_tile) break;
        float pk[kAttentionGroup];
#pragma unroll
        for (int g = 0; g < kAttentionGroup; g += 4)
          *reinterpret_cast<float4*>(&pk[g]) = *reinterpret_cast<const float4*>(&tile_p[warp][k0 + u][g]);
#pragma unroll
        for (int g = 0; g < kAttentionGroup; ++g) {
          if (g >= heads) break;
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[g][i] += pk[g] * v[u][i];
        }
      }
    }
    __syncwarp();  // the next tile rewrites tile_p and tile_v
  }
  if (lane == 0)
    for (int g = 0; g < heads; ++g) warp_m[warp][g] = m[g], warp_l[warp][g] = l[g];
  if (owns_dims)
    for (int g = 0; g < heads; ++g)
#pragma unroll
      for (int i = 0; i < 8; ++i) warp_acc[warp][g][8 * lane + i] = acc[g][i];
  __syncthreads();
  write_partials(warp_m, warp_l, &warp_acc[0][0][0], kAttentionHeadDim, h0, heads, head_dim, partials);
}

// ---- The tensor-core kernel: fp16, int8 and q4 cells ----
//
// Block (b, split), as for the float32 kernel: up to 8 query heads of one KV head, one share of
// the keys, in tiles of 16 keys whose cells cp.async brings into shared memory up to three tiles
// ahead (TensorAttention::kStages). Past 64 keys a split, each warp takes tiles of its own; up to
// 64 (shallow contexts, each warp at most one tile) the block's warps take each tile together, a
// slice of 64 dims each, so a tile's chain is a fraction of a whole head's: a quarter at 256 dims,
// a half at 128, where two streams of two warps share the block (attend_tiles).
// Both products run on mma.sync m16n8k16 (fp16 in, float32 sums):
// - scores, C = A B: A holds the queries, rows 0-7 the 8 heads' q in fp16 and rows 8-15 the
//   remainders q - fp16(q) (so the two rows of a head sum to q to ~22 bits: the float32 products
//   the host computes, not fp16 ones); B holds 8 keys' stored codes (fp16 values, int8 or q4 codes:
//   all exact in fp16). A group's code sums (the 64 values of an int8 scale, the 32 of a q4 block)
//   are scaled by the key's scale in float32. q is first scaled by a power of two per head (exact)
//   so that neither part leaves fp16's range.
// - values, O^T = V^T P: A holds 16 dims of the 16 keys' values (codes), B the weights p (times
//   the key's scale for a scaled store) split the same way into fp16 and remainder, times a power
//   of two that puts the tile's largest weight near 2^14.
// Each store takes the dims of a step in its own order (the same for both operands: the same dot
// product), which lets a lane read its codes in whole words.

constexpr int kTileKeys = 16;  // keys per warp step: the value product's k
constexpr int kStepDims = 16;  // dims per score product: its k

// Bytes per key slot in a stage, a multiple of 16 that is `residue` modulo 128: the residues that
// spread a warp's shared loads over all banks (the fp16 keys' 8-byte loads want 32, all else 16).
constexpr int slot_stride(int bytes, int residue) { return (bytes - residue + 127) / 128 * 128 + residue; }

__device__ __forceinline__ uint32_t bits_of(__half2 h) { return *reinterpret_cast<const uint32_t*>(&h); }

// x0, x1 as fp16 pairs hi (fp16(x)) and lo (fp16(x - hi)): x = hi + lo to ~22 bits.
__device__ __forceinline__ void split_half2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x0, x1);
  const float2 back = __half22float2(h);
  hi = bits_of(h);
  lo = bits_of(__floats2half2_rn(x0 - back.x, x1 - back.y));
}

// Two small integers as an fp16 pair: the bytes `selector` picks from `bytes` (its byte 4: 0x64)
// read as fp16 1024 + byte, minus `bias`; exact.
__device__ __forceinline__ uint32_t integer_pair(uint32_t bytes, unsigned selector, float bias) {
  const uint32_t w = __byte_perm(bytes, 0x64646464u, selector);
  return bits_of(__hsub2(*reinterpret_cast<const __half2*>(&w), __float2half2_rn(bias)));
}

// 2^e, e clamped to [-126, 126] (normal floats, exact reciprocals).
__device__ __forceinline__ float power_of_two(int e) { return __int_as_float((127 + max(-126, min(126, e))) << 23); }
// The power of two that takes |x| <= big into [2^14, 2^15): room in fp16 (max 65504), no subnormals.
__device__ __forceinline__ float fp16_headroom(float big) {
  return power_of_two(14 - (int((__float_as_uint(big) >> 23) & 0xff) - 127));
}

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t load_u32_unaligned2(const uint8_t* p) {  // 2-byte aligned
  const auto* h = reinterpret_cast<const unsigned short*>(p);
  return uint32_t(h[0]) | uint32_t(h[1]) << 16;
}

// One store's cells for the tensor-core kernel: a slice of SD dims (SD = HD: the whole head) of a
// head of HD dims. A key's slot holds the slice's codes (then, for int8, the whole head's scales: a
// slice's own are not a cp.async unit); kCodeBytes/kScaleBytes and code_offset/scale_offset say
// where they lie in a row. Keys (the score product's B): key_pair gives step s's (of the slice) two
// registers for lane t of the quad, the slice's dims 16 s + 4 t + dim_order(j) for j = 0..3;
// key_scale the scale of the slice's group of kStepsPerGroup steps. Values (the value product's
// A): chunks of kTilesPerChunk m-tiles of 16 dims sharing one scale; value_tiles gives a chunk's
// registers for the lane's four keys (rows 2t, 2t + 1, 2t + 8, 2t + 9 of the tile) and row g of
// the quad's group, value_dim the slice's dim of row g (half 0) or g + 8 (half 1) of m-tile i of
// the chunk.
template <Store S, int HD, int SD>
struct TensorCells;

template <int HD, int SD>
struct TensorCells<Store::f16, HD, SD> {
  static constexpr bool kScaled = false;
  static constexpr int kCodeBytes = 2 * SD, kScaleBytes = 0, kStepsPerGroup = SD / kStepDims, kTilesPerChunk = 4;
  static constexpr int kKeyStride = slot_stride(kCodeBytes, 32), kValueStride = slot_stride(kCodeBytes, 16);
  __device__ static int64_t code_offset(int kvh, int slice) { return int64_t(kvh) * 2 * HD + slice * kCodeBytes; }
  __device__ static int64_t scale_offset(int, int64_t) { return 0; }
  __device__ static constexpr int dim_order(int j) { return j; }
  __device__ static void key_pair(const uint8_t* cell, int s, int t, uint32_t (&b)[2]) {
    const uint2 w = *reinterpret_cast<const uint2*>(cell + 2 * (kStepDims * s + 4 * t));
    b[0] = w.x, b[1] = w.y;
  }
  __device__ static float key_scale(const uint8_t*, int, int) { return 1.0f; }
  // Chunk c: lane g's dims 8 (8c + g) .. + 7, one 16-byte word per key (m-tile i: dims 2i, 2i + 1).
  __device__ static int value_dim(int c, int i, int g, int half) { return 8 * (8 * c + g) + 2 * i + half; }
  __device__ static float value_scale(const uint8_t*, int, int) { return 1.0f; }
  __device__ static void value_tiles(const uint8_t* const (&cell)[4], int c, int g, uint32_t (&a)[kTilesPerChunk][4]) {
    uint4 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = *reinterpret_cast<const uint4*>(cell[k] + 16 * (8 * c + g));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t k0 = (&w[0].x)[i], k1 = (&w[1].x)[i], k8 = (&w[2].x)[i], k9 = (&w[3].x)[i];
      a[i][0] = __byte_perm(k0, k1, 0x5410), a[i][1] = __byte_perm(k0, k1, 0x7632);
      a[i][2] = __byte_perm(k8, k9, 0x5410), a[i][3] = __byte_perm(k8, k9, 0x7632);
    }
  }
};

// int8: all codes of the row, then one fp16 scale per 64 values (kv/codec.h).
template <int HD, int SD>
struct TensorCells<Store::i8, HD, SD> {
  static constexpr bool kScaled = true;
  static constexpr int kGroupsPerSlice = SD / kKvInt8Group;
  static constexpr int kCodeBytes = SD, kScaleBytes = 2 * (HD / kKvInt8Group), kStepsPerGroup = kKvInt8Group / kStepDims;
  static constexpr int kTilesPerChunk = kKvInt8Group / 16;
  static constexpr int kKeyStride = slot_stride(kCodeBytes + kScaleBytes, 16), kValueStride = kKeyStride;
  __device__ static int64_t code_offset(int kvh, int slice) { return int64_t(kvh) * HD + slice * kCodeBytes; }
  __device__ static int64_t scale_offset(int kvh, int64_t row_values) { return row_values + int64_t(kvh) * kScaleBytes; }
  // A word of 4 codes (dims +0..3) gives the pairs (0, 2) and (1, 3).
  __device__ static constexpr int dim_order(int j) { return j == 1 ? 2 : j == 2 ? 1 : j; }
  __device__ static void key_pair(const uint8_t* cell, int s, int t, uint32_t (&b)[2]) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(cell + kStepDims * s + 4 * t) ^ 0x80808080u;
    b[0] = integer_pair(w, 0x4240, 1152.0f), b[1] = integer_pair(w, 0x4341, 1152.0f);
  }
  __device__ static float key_scale(const uint8_t* cell, int slice, int group) {
    return __half2float(reinterpret_cast<const __half*>(cell + kCodeBytes)[slice * kGroupsPerSlice + group]);
  }
  // Chunk c: the 64 dims of the slice's scale c; lane g's dims 64c + 8g .. + 7 (m-tile i: dims 2i, 2i + 1).
  __device__ static int value_dim(int c, int i, int g, int half) { return kKvInt8Group * c + 8 * g + 2 * i + half; }
  __device__ static float value_scale(const uint8_t* cell, int slice, int c) { return key_scale(cell, slice, c); }
  __device__ static void value_tiles(const uint8_t* const (&cell)[4], int c, int g, uint32_t (&a)[kTilesPerChunk][4]) {
    uint2 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = *reinterpret_cast<const uint2*>(cell[k] + kKvInt8Group * c + 8 * g);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned pick = i % 2 ? 0x7362 : 0x5140;  // bytes 2i, 2i + 1 of each key, interleaved
      const uint32_t x01 = __byte_perm((&w[0].x)[i / 2], (&w[1].x)[i / 2], pick) ^ 0x80808080u;
      const uint32_t x89 = __byte_perm((&w[2].x)[i / 2], (&w[3].x)[i / 2], pick) ^ 0x80808080u;
      a[i][0] = integer_pair(x01, 0x4140, 1152.0f), a[i][1] = integer_pair(x01, 0x4342, 1152.0f);
      a[i][2] = integer_pair(x89, 0x4140, 1152.0f), a[i][3] = integer_pair(x89, 0x4342, 1152.0f);
    }
  }
};

// q4_0 blocks (fp16 d, then 16 bytes: value j < 16 in byte j's low nibble, j + 16 in its high one).
template <int HD, int SD>
struct TensorCells<Store::q4, HD, SD> {
  static constexpr bool kScaled = true;
  static constexpr int kCodeBytes = SD / kKvQ4Values * kKvQ4Bytes, kScaleBytes = 0;
  static constexpr int kStepsPerGroup = kKvQ4Values / kStepDims, kTilesPerChunk = kKvQ4Values / 16;
  static constexpr int kKeyStride = slot_stride(kCodeBytes, 16), kValueStride = kKeyStride;
  __device__ static int64_t code_offset(int kvh, int slice) {
    return int64_t(kvh) * (HD / kKvQ4Values * kKvQ4Bytes) + slice * kCodeBytes;
  }
  __device__ static int64_t scale_offset(int, int64_t) { return 0; }
  __device__ static constexpr int dim_order(int j) { return j == 1 ? 2 : j == 2 ? 1 : j; }
  // Step s: block s / 2, values 16 (s % 2) + 4t .. + 3: the low (s even) or high nibbles of bytes 4t .. 4t + 3.
  __device__ static void key_pair(const uint8_t* cell, int s, int t, uint32_t (&b)[2]) {
    const uint32_t w = load_u32_unaligned2(cell + s / 2 * kKvQ4Bytes + 2 + 4 * t);
    const uint32_t nibbles = (s % 2 ? w >> 4 : w) & 0x0f0f0f0fu;
    b[0] = integer_pair(nibbles, 0x4240, 1032.0f), b[1] = integer_pair(nibbles, 0x4341, 1032.0f);
  }
  __device__ static float key_scale(const uint8_t* cell, int, int group) {
    return __half2float(*reinterpret_cast<const __half*>(cell + group * kKvQ4Bytes));
  }
  // Chunk c: block c; lane g reads bytes 2g, 2g + 1: m-tile 0 their low nibbles (values 2g, 2g + 1),
  // m-tile 1 their high ones (values 16 + 2g, 17 + 2g).
  __device__ static int value_dim(int c, int i, int g, int half) { return kKvQ4Values * c + 16 * i + 2 * g + half; }
  __device__ static float value_scale(const uint8_t* cell, int slice, int c) { return key_scale(cell, slice, c); }
  __device__ static void value_tiles(const uint8_t* const (&cell)[4], int c, int g, uint32_t (&a)[kTilesPerChunk][4]) {
    uint32_t h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = *reinterpret_cast<const unsigned short*>(cell[k] + c * kKvQ4Bytes + 2 + 2 * g);
    const uint32_t y01 = __byte_perm(h[0], h[1], 0x5140), y89 = __byte_perm(h[2], h[3], 0x5140);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t n01 = (i ? y01 >> 4 : y01) & 0x0f0f0f0fu, n89 = (i ? y89 >> 4 : y89) & 0x0f0f0f0fu;
      a[i][0] = integer_pair(n01, 0x4140, 1032.0f), a[i][1] = integer_pair(n01, 0x4342, 1032.0f);
      a[i][2] = integer_pair(n89, 0x4140, 1032.0f), a[i][3] = integer_pair(n89, 0x4342, 1032.0f);
    }
  }
};

// The rotated store's cells are q4 cells (q arrives rotated; the merge rotates the output back).
template <int HD, int SD>
struct TensorCells<Store::q4r, HD, SD> : TensorCells<Store::q4, HD, SD> {};

template <Store S>
constexpr bool kCellsOnTensorCores = S == Store::f16 || S == Store::i8 || S == Store::q4 || S == Store::q4r;

// The largest power-of-two-sized copy (16, 8 or 4 bytes) that tiles a span of `bytes` at `offset`
// in rows of row_bytes (a row's start is then aligned to it as well).
__device__ __forceinline__ int copy_unit(int64_t row_bytes, int64_t offset, int bytes) {
  const int64_t all = row_bytes | offset | bytes;
  return all % 16 == 0 ? 16 : all % 8 == 0 ? 8 : 4;
}

// Lane l copies piece l % chunks of key l / chunks, then the same piece kKeysPerPass keys on, so
// its addresses step by a constant (at most 32 pieces a key; a key's pieces in one pass).
template <int U, int kBytes, bool kPartial>
__device__ __forceinline__ void copy_span_by(uint8_t* to, int to_stride, const uint8_t* from, int64_t from_stride,
                                             int valid_keys, int lane) {
  constexpr int chunks = kBytes / U;
  static_assert(chunks <= kWarp, "a key's span in one pass of the warp");
  constexpr int kKeysPerPass = kWarp / chunks;
  const int first_key = lane / chunks, c = lane % chunks;
  if (first_key >= kKeysPerPass) return;  // lanes past the last whole key of a pass
  to += first_key * to_stride + c * U;
  const uint8_t* at = from + first_key * from_stride + c * U;
#pragma unroll
  for (int key = first_key; key < kTileKeys; key += kKeysPerPass) {
    const bool valid = !kPartial || key < valid_keys;
    copy_async<U, true>(to, valid ? at : from, valid);
    to += kKeysPerPass * to_stride;
    at += kKeysPerPass * from_stride;
  }
}

// One span (kBytes at each of the tile's 16 rows, from_stride apart) into slots to_stride apart;
// keys past valid_keys (kPartial: a split's last tile) are zeros.
template <int kBytes, bool kPartial>
__device__ __forceinline__ void copy_span(int unit, uint8_t* to, int to_stride, const uint8_t* from,
                                          int64_t from_stride, int valid_keys, int lane) {
  if constexpr (kBytes % 16 == 0)
    if (unit == 16) return copy_span_by<16, kBytes, kPartial>(to, to_stride, from, from_stride, valid_keys, lane);
  if constexpr (kBytes % 8 == 0 && kBytes <= 8 * kWarp)
    if (unit >= 8) return copy_span_by<8, kBytes, kPartial>(to, to_stride, from, from_stride, valid_keys, lane);
  if constexpr (kBytes <= 4 * kWarp)
    copy_span_by<4, kBytes, kPartial>(to, to_stride, from, from_stride, valid_keys, lane);
  else __trap();  // unreachable: spans over 128 bytes lie in rows 8-byte aligned at least (128 or 256 dims)
}

// Where a warp's copies of one side come from: the side's store and its slice's spans.
struct SideSource {
  const uint8_t* store;
  int64_t row_bytes, code_offset, scale_offset;
  int code_unit, scale_unit;
};

template <class C>
__device__ SideSource side_source(const void* store, int64_t row_bytes, int kvh, int slice, int64_t row_values) {
  SideSource s{static_cast<const uint8_t*>(store), row_bytes, C::code_offset(kvh, slice),
               C::scale_offset(kvh, row_values), 0, 0};
  s.code_unit = copy_unit(row_bytes, s.code_offset, C::kCodeBytes);
  s.scale_unit = copy_unit(row_bytes, s.scale_offset, C::kScaleBytes > 0 ? C::kScaleBytes : 16);
  return s;
}

// The tile's cells of one side, from physical row `physical` on, into its slots.
template <class C, bool kPartial>
__device__ __forceinline__ void copy_side(const SideSource& side, int64_t physical, int valid_keys, uint8_t* slots,
                                          int stride, int lane) {
  const uint8_t* row = side.store + physical * side.row_bytes;
  copy_span<C::kCodeBytes, kPartial>(side.code_unit, slots, stride, row + side.code_offset, side.row_bytes,
                                     valid_keys, lane);
  if constexpr (C::kScaleBytes > 0)
    copy_span<C::kScaleBytes, kPartial>(side.scale_unit, slots + C::kCodeBytes, stride, row + side.scale_offset,
                                        side.row_bytes, valid_keys, lane);
}

// The block's query heads as the score product's A fragments, [step][lane] (registers a0..a3 of
// lane (g, t): head g's fp16 parts and remainders at the step's dims of K's order), each head
// scaled by factor[g] (a power of two). Heads past `heads` are zeros.
template <class K, int HD>
__device__ void stage_queries(const float* qg, int h0, int heads, uint4* frags, float* factor) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int g = warp; g < kAttentionGroup; g += kAttentionWarps) {
    float big = 0.0f;
    if (g < heads)
      for (int d = lane; d < HD; d += kWarp) big = fmaxf(big, fabsf(qg[int64_t(h0 + g) * 2 * HD + d]));
    big = warp_max(big);
    if (lane == 0) factor[g] = fp16_headroom(big);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < HD / kStepDims * kWarp; e += blockDim.x) {
    const int s = e / kWarp, g = e % kWarp / 4, t = e % 4;
    uint32_t hi[2] = {0, 0}, lo[2] = {0, 0};
    if (g < heads) {
      const float* q = qg + int64_t(h0 + g) * 2 * HD + kStepDims * s + 4 * t;
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = q[K::dim_order(j)] * factor[g];
      split_half2(v[0], v[1], hi[0], lo[0]);
      split_half2(v[2], v[3], hi[1], lo[1]);
    }
    frags[e] = make_uint4(hi[0], lo[0], hi[1], lo[1]);
  }
  __syncthreads();
}

// The slice's share of the tile's scores for head g (the lane's quad row) and keys 2t, 2t + 1,
// 8 + 2t, 9 + 2t, before the softmax scale and the query's factor; frags: the slice's steps.
template <class K, int SD>
__device__ __forceinline__ void tile_scores(const uint4* frags, const uint8_t* keys, int lane, int slice,
                                            float (&score)[4]) {
  const int g = lane / 4, t = lane % 4;
  const uint8_t* own[2] = {keys + g * K::kKeyStride, keys + (8 + g) * K::kKeyStride};
  float c[2][4] = {}, odd[2][4] = {};
#pragma unroll
  for (int group = 0; group < SD / kStepDims / K::kStepsPerGroup; ++group) {
    float part[2][4] = {};
#pragma unroll
    for (int ss = 0; ss < K::kStepsPerGroup; ++ss) {
      const int s = group * K::kStepsPerGroup + ss;
      const uint4 q = frags[s * kWarp + lane];
      const uint32_t a[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint32_t b[2];
        K::key_pair(own[j], s, t, b);
        if constexpr (K::kScaled) mma_f16(part[j], a, b);
        else if (s % 2) mma_f16(odd[j], a, b);  // two chains of products per key octet: half the latency
        else mma_f16(c[j], a, b);
      }
    }
    if constexpr (K::kScaled)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float s0 = K::key_scale(keys + (8 * j + 2 * t) * K::kKeyStride, slice, group);
        const float s1 = K::key_scale(keys + (8 * j + 2 * t + 1) * K::kKeyStride, slice, group);
        c[j][0] += part[j][0] * s0, c[j][1] += part[j][1] * s1, c[j][2] += part[j][2] * s0, c[j][3] += part[j][3] * s1;
      }
  }
  if constexpr (!K::kScaled)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[j][e] += odd[j][e];
  // Rows g (fp16 parts) and g + 8 (remainders) of the same head.
  score[0] = c[0][0] + c[0][2], score[1] = c[0][1] + c[0][3], score[2] = c[1][0] + c[1][2], score[3] = c[1][1] + c[1][3];
}

// The lane's four value cells in a tile: keys 2t, 2t + 1, 8 + 2t, 9 + 2t (rows of the value
// product's A).
template <class V>
__device__ __forceinline__ void value_cells(const uint8_t* values, int t, const uint8_t* (&cell)[4]) {
  cell[0] = values + 2 * t * V::kValueStride, cell[1] = values + (2 * t + 1) * V::kValueStride;
  cell[2] = values + (2 * t + 8) * V::kValueStride, cell[3] = values + (2 * t + 9) * V::kValueStride;
}

// The power of two for a tile's value weights over the slice: 2^14 for a store without scales
// (p <= 1), else the one that puts the slice's largest value scale in the tile near 2^14 (p s <=
// that scale). The same for every lane: each quad sees all 16 keys.
template <class V, int SD>
__device__ __forceinline__ float value_factor(const uint8_t* values, int t, int slice) {
  if constexpr (!V::kScaled) {
    return 16384.0f;
  } else {
    const uint8_t* cell[4];
    value_cells<V>(values, t, cell);
    float big = 0.0f;
#pragma unroll
    for (int c = 0; c < SD / 16 / V::kTilesPerChunk; ++c)
#pragma unroll
      for (int k = 0; k < 4; ++k) big = fmaxf(big, fabsf(V::value_scale(cell[k], slice, c)));
    big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, 1));
    // A tile of zero scales takes the factor of the smallest nonzero fp16 scale, 2^38: so every
    // factor lies in [2^-1, 2^38] and a tile-to-tile ratio cannot overflow the accumulators.
    return fp16_headroom(fmaxf(fmaxf(big, __shfl_xor_sync(0xffffffffu, big, 2)), 0x1p-24f));
  }
}

// acc (the slice's O^T tiles: m-tile i's rows, heads 2t and 2t + 1) += f times the tile's values
// weighted by p (head g, keys 2t, 2t + 1, 8 + 2t, 9 + 2t), times each key's scale for a scaled
// store; f is value_factor's power of two (the caller keeps acc in units of the current tile's f).
template <class V, int SD>
__device__ __forceinline__ void tile_values(const uint8_t* values, int lane, int slice, const float (&p)[4], float f,
                                            float (&acc)[SD / 16][4]) {
  const int g = lane / 4, t = lane % 4;
  const uint8_t* cell[4];
  value_cells<V>(values, t, cell);
  uint32_t hi[2], lo[2];
  if constexpr (!V::kScaled) {
    split_half2(p[0] * f, p[1] * f, hi[0], lo[0]);
    split_half2(p[2] * f, p[3] * f, hi[1], lo[1]);
  }
#pragma unroll
  for (int c = 0; c < SD / 16 / V::kTilesPerChunk; ++c) {
    uint32_t a[V::kTilesPerChunk][4];
    V::value_tiles(cell, c, g, a);
    if constexpr (V::kScaled) {
      float w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = p[k] * V::value_scale(cell[k], slice, c) * f;
      split_half2(w[0], w[1], hi[0], lo[0]);
      split_half2(w[2], w[3], hi[1], lo[1]);
    }
#pragma unroll
    for (int i = 0; i < V::kTilesPerChunk; ++i) {
      mma_f16(acc[c * V::kTilesPerChunk + i], a[i], hi);
      mma_f16(acc[c * V::kTilesPerChunk + i], a[i], lo);
    }
  }
}

// Dynamic shared memory a block may take when n blocks share a multiprocessor (sm_90: 228 KB per
// multiprocessor, 227 KB per block, 1 KB of each block's reserved).
constexpr int shared_budget(int blocks) { return blocks == 1 ? 214 * 1024 : (228 * 1024) / blocks - 1024 - 512; }

// The most stages per warp (at most 4) whose bytes, with the queries', fit in `budget`.
constexpr int stages_within(int query_bytes, int stage_bytes, int budget) {
  int n = 4;
  while (n > 1 && query_bytes + kAttentionWarps * n * stage_bytes > budget) --n;
  return n;
}

// Stages per warp (one computed on, the rest arriving): as many as fit (up to 4) with two blocks on
// a multiprocessor, else with one. (Three blocks of two stages, where the registers allow them,
// decoded 2-4% slower than two of three or four at depth 131,072 on the H200: int8, k8v4, q4.)
constexpr int attention_stages(int query_bytes, int stage_bytes) {
  return stages_within(query_bytes, stage_bytes, shared_budget(2)) >= 2
             ? stages_within(query_bytes, stage_bytes, shared_budget(2))
             : stages_within(query_bytes, stage_bytes, shared_budget(1));
}

// Splits of at most this many keys (a tile for each warp of a block, or fewer) take the block's
// warps on one tile at once, a slice of kShallowSliceDims dims each: a tile's chain is then a
// fraction of a whole head's. Deeper splits give each warp tiles of its own: every warp of a tile
// would pay its fixed costs (copies, softmax, value factor), which at depth 131,072 cost more than
// the extra warps hid (docs/KV.md).
constexpr int kShallowSplitKeys = kAttentionWarps * kTileKeys;
constexpr int kShallowSliceDims = 64;

// The block's layout for slices of SD dims (SD = HD: a warp a tile): HD / SD warps share a stream of
// tiles, kStreams streams a block. Shared memory: the query fragments, then each warp's stages
// (and, with shared tiles, the streams' score sums), or, once the tiles are done, each stream's
// output for the merge.
template <Store KS, Store VS, int HD, int SD>
struct TensorAttention {
  using K = TensorCells<KS, HD, SD>;
  using V = TensorCells<VS, HD, SD>;
  static constexpr int kSlices = HD / SD, kStreams = kAttentionWarps / kSlices;
  static constexpr int kQueryBytes = HD / kStepDims * kWarp * 16;
  static constexpr int kStageBytes = kTileKeys * (K::kKeyStride + V::kValueStride);
  static constexpr int kMergeBytes = kAttentionWarps * kAttentionGroup * HD * 4;
  static constexpr int kStages = SD == HD ? attention_stages(kQueryBytes, kStageBytes) : 3;
  static_assert(kStages >= 2, "decode attention's stages do not fit in shared memory");
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kSumBytes = kSlices > 1 ? kStreams * 2 * kSlices * kWarp * 16 : 0;
  static constexpr int kSharedBytes = kQueryBytes + std::max(kAttentionWarps * kWarpBytes + kSumBytes, kMergeBytes);
};

// The kernel's shared memory: the deep splits' layout, which the shallow ones fit in (so the
// blocks a multiprocessor holds, and with them the splits, are the deep layout's).
template <Store KS, Store VS, int HD>
constexpr int kTensorSharedBytes = TensorAttention<KS, VS, HD, HD>::kSharedBytes;

// The block's share of decode attention with slices of SD dims (TensorAttention's layout): each
// stream's tiles (16 keys, a stream's tiles kStreams apart) with their cells brought into its
// warps' stages by cp.async kStages - 1 tiles ahead, an online softmax per stream (every warp of a
// stream sums the slices' scores in slice order, so all hold the same), then the streams' outputs
// merged into the block's partials.
template <Store KS, Store VS, int HD, int SD>
__device__ __forceinline__ void attend_tiles(const float* qg, const KvView& kv, const int32_t* pages, int n_kv_heads,
                                             const BlockShare& share,
                                             uint8_t* shared, float* partials) {
  using A = TensorAttention<KS, VS, HD, SD>;
  using K = typename A::K;
  using V = typename A::V;
  __shared__ float factor[kAttentionGroup], warp_m[kAttentionWarps][kAttentionGroup];
  __shared__ float warp_l[kAttentionWarps][kAttentionGroup];
  const int kvh = share.kvh, h0 = share.h0, heads = share.heads;
  const int64_t begin = share.begin, end = share.end;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const int stream = warp / A::kSlices, slice = warp % A::kSlices;
  auto* frags = reinterpret_cast<uint4*>(shared);
  uint8_t* stages = shared + A::kQueryBytes;
  auto* sums = reinterpret_cast<float4*>(stages + kAttentionWarps * A::kWarpBytes) + stream * 2 * A::kSlices * kWarp;
  const int64_t row_values = int64_t(n_kv_heads) * HD;
  const SideSource k_side = side_source<K>(kv.k, kv.k_row_bytes, kvh, slice, row_values);
  const SideSource v_side = side_source<V>(kv.v, kv.v_row_bytes, kvh, slice, row_values);
  uint8_t* own = stages + warp * A::kWarpBytes;
  // A tile's cells lie inside one page (tiles start at multiples of 16, pages hold 64 positions);
  // only a split's last tile may be partial, and only its copies carry a mask.
  const auto send = [&](int64_t tile, int stage) {
    if (tile < end) {
      uint8_t* slots = own + stage * A::kStageBytes;
      const int64_t physical = int64_t(pages[tile / kKvPagePositions]) * kKvPagePositions + tile % kKvPagePositions;
      const int valid = int(min(int64_t(kTileKeys), end - tile));
      if (valid == kTileKeys) {
        copy_side<K, false>(k_side, physical, valid, slots, K::kKeyStride, lane);
        copy_side<V, false>(v_side, physical, valid, slots + kTileKeys * K::kKeyStride, V::kValueStride, lane);
      } else {
        copy_side<K, true>(k_side, physical, valid, slots, K::kKeyStride, lane);
        copy_side<V, true>(v_side, physical, valid, slots + kTileKeys * K::kKeyStride, V::kValueStride, lane);
      }
    }
    copies_sent();
  };
  const int64_t first = begin + int64_t(stream) * kTileKeys, stride = A::kStreams * kTileKeys;
  for (int k = 0; k + 1 < A::kStages; ++k) send(first + k * stride, k);
  stage_queries<K, HD>(qg, h0, heads, frags, factor);
  const uint4* slice_frags = frags + slice * (SD / kStepDims) * kWarp;
  const float score_scale = rsqrtf(float(HD)) / factor[g];
  float m = -INFINITY, l = 0.0f, acc[SD / 16][4] = {}, f = 1.0f;  // acc: in units of 1 / f
  int stage = 0, turn = 0;
  // Shared tiles: every stream takes as many turns as the one with the most tiles (a stream past its
  // last tile only meets the block at each turn's barrier), so the block's warps meet at the same
  // barriers. (Streams meeting at barriers of their own, as many as each stream's tiles, were
  // correct but not to compute-sanitizer's racecheck, which paired the barriers by count.)
  const int64_t tiles = (end - begin + kTileKeys - 1) / kTileKeys;
  const int64_t turns_end = A::kSlices == 1 ? end : begin + (tiles + A::kStreams - 1) / A::kStreams * stride;
  for (int64_t tile = first; tile < turns_end; tile += stride, stage = (stage + 1) % A::kStages, turn ^= 1) {
    send(tile + (A::kStages - 1) * stride, (stage + A::kStages - 1) % A::kStages);
    copies_arrived_but<A::kStages - 1>();  // this tile's group: the sends after it may be in flight
    __syncwarp();
    const bool mine = A::kSlices == 1 || tile < end;
    const uint8_t* slots = own + stage * A::kStageBytes;
    float p[4];
    if (mine) tile_scores<K, SD>(slice_frags, slots, lane, slice, p);
    if constexpr (A::kSlices > 1) {
      // Every slice's share in (a warp rewrites this turn's sums two turns on, after the next
      // barrier, which each warp reaches only once it has read them).
      if (mine) sums[(turn * A::kSlices + slice) * kWarp + lane] = make_float4(p[0], p[1], p[2], p[3]);
      __syncthreads();
      if (!mine) continue;
      float4 sum = sums[turn * A::kSlices * kWarp + lane];
#pragma unroll
      for (int w = 1; w < A::kSlices; ++w) {
        const float4 x = sums[(turn * A::kSlices + w) * kWarp + lane];
        sum.x += x.x, sum.y += x.y, sum.z += x.z, sum.w += x.w;
      }
      p[0] = sum.x, p[1] = sum.y, p[2] = sum.z, p[3] = sum.w;
    }
    const int key[4] = {2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t}, keys = int(min(int64_t(kTileKeys), end - tile));
    float big = -INFINITY;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      p[k] = key[k] < keys ? p[k] * score_scale : -INFINITY;
      big = fmaxf(big, p[k]);
    }
    big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, 1));
    big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, 2));  // finite: the tile has a key
    const float m_new = fmaxf(m, big), old = expf(m - m_new);
    float sum_p = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) p[k] = expf(p[k] - m_new), sum_p += p[k];
    l = l * old + sum_p;
    m = m_new;
    // The accumulators' columns are heads 2t and 2t + 1, whose softmax lives in quads 2t and 2t + 1;
    // their rescale also takes them to this tile's factor (powers of two: exact).
    const uint8_t* values = slots + kTileKeys * K::kKeyStride;
    const float f_tile = value_factor<V, SD>(values, t, slice), to_tile = f_tile / f;
    f = f_tile;
    const float old0 = __shfl_sync(0xffffffffu, old, 8 * t) * to_tile;
    const float old1 = __shfl_sync(0xffffffffu, old, 8 * t + 4) * to_tile;
    if (__any_sync(0xffffffffu, old0 != 1.0f || old1 != 1.0f))  // deep in a split the maxima rarely move
#pragma unroll
      for (int i = 0; i < SD / 16; ++i) acc[i][0] *= old0, acc[i][1] *= old1, acc[i][2] *= old0, acc[i][3] *= old1;
    tile_values<V, SD>(values, lane, slice, p, f, acc);
    __syncwarp();  // the next send overwrites this stage
  }
  copies_arrived();
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  __syncthreads();  // every warp is done with the stages: they hold the streams' outputs now
  auto* stream_o = reinterpret_cast<float*>(stages);  // [stream][head][HD]
  if (slice == 0 && t == 0) warp_m[stream][g] = m, warp_l[stream][g] = l;
  if (const int e = int(threadIdx.x); e < (kAttentionWarps - A::kStreams) * kAttentionGroup)
    warp_m[A::kStreams + e / kAttentionGroup][e % kAttentionGroup] = -INFINITY;  // no such stream
  const float unscale = 1.0f / f;
#pragma unroll
  for (int i = 0; i < SD / 16; ++i) {
    const int c = i / V::kTilesPerChunk, ci = i % V::kTilesPerChunk;
    const int r0 = SD * slice + V::value_dim(c, ci, g, 0), r1 = SD * slice + V::value_dim(c, ci, g, 1);
    float* o = stream_o + (stream * kAttentionGroup + 2 * t) * HD;
    o[r0] = acc[i][0] * unscale, o[HD + r0] = acc[i][1] * unscale;
    o[r1] = acc[i][2] * unscale, o[HD + r1] = acc[i][3] * unscale;
  }
  __syncthreads();
  write_partials(warp_m, warp_l, stream_o, HD, h0, heads, HD, partials);
}

// The tensor-core kernel: block (b, split) as for the float32 kernel, on shared tiles in slices
// for shallow splits and on a tile a warp for deeper ones (the choice is the same for every block
// of a launch: it depends on the depth and the splits alone).
template <Store KS, Store VS, int HD>
__global__ void __launch_bounds__(kAttentionWarps * kWarp)
    attention_decode_tensor_kernel(const float* qg, KvView kv, const int64_t* position, int n_heads, int n_kv_heads,
                                   float* partials, int64_t q_stride) {
  begin_after_inputs();
  const RowPlace place = to_token(qg, q_stride, partials, kv, position, n_heads, HD);
  const BlockShare share = block_share(n_heads, n_kv_heads, place.position, kTensorSplitKeys);
  if (share.begin >= share.end) return;  // a split past the keys: the merge does not read it
  static_assert(TensorAttention<KS, VS, HD, kShallowSliceDims>::kSharedBytes <= kTensorSharedBytes<KS, VS, HD>,
                "shallow splits' layout inside the deep splits' shared memory");
  extern __shared__ __align__(16) uint8_t shared[];
  if (share.per_split <= kShallowSplitKeys)
    attend_tiles<KS, VS, HD, kShallowSliceDims>(qg, kv, place.pages, n_kv_heads, share, shared, partials);
  else
    attend_tiles<KS, VS, HD, HD>(qg, kv, place.pages, n_kv_heads, share, shared, partials);
}

constexpr int kMaxAttentionSplits = 1024;

constexpr int kMergeThreads = 1024;

// One block per query head: the splits' partials merged by their log-sum-exp weights (each split's
// weight computed once, by its own thread; then warp w sums the splits w, w + 32, ... for dims lane,
// lane + 32, ... (loads independent of each other), and the warps' sums are added in warp order),
// rotated back by H when the values are stored rotated, then the sigmoid output gate. The gate and
// each warp's first split are loaded before the weights' reductions, so their trips to memory
// overlap those (the sums are the same, in the same order).
template <bool kRotatedValues>
__global__ void attention_merge_kernel(const float* qg, const float* partials, const int64_t* position,
                                       bool row_positions, int n_splits, int min_keys, int head_dim, float* out,
                                       kernels::TokenRows tokens) {
  begin_after_inputs();
  const int h = blockIdx.x, t = blockIdx.y;  // head h of the window's token t (or the step's row t)
  qg += t * tokens.in_stride, out += t * tokens.out_stride;
  partials += int64_t(t) * gridDim.x * n_splits * (head_dim + 2);
  const int64_t n_all = (row_positions ? position[t] : *position + t) + 1, per_split = keys_per_split(n_all, n_splits, min_keys), stride = head_dim + 2;
  const float* first = partials + int64_t(h) * n_splits * stride;
  n_splits = int(min(int64_t(n_splits), (n_all + per_split - 1) / per_split));  // the splits that had keys
  constexpr int kWarps = kMergeThreads / kWarp, kDimsPerLane = kAttentionHeadDim / kWarp;
  static_assert(kMergeThreads >= kAttentionHeadDim, "a thread's dim of the gate");
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const float gate = int(threadIdx.x) < head_dim ? qg[int64_t(h) * 2 * head_dim + head_dim + threadIdx.x] : 0.0f;
  float early[kDimsPerLane] = {};  // split `warp`'s values
  if (warp < n_splits)
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k)
      if (lane + kWarp * k < head_dim) early[k] = first[warp * stride + 2 + lane + kWarp * k];
  __shared__ float weight[kMaxAttentionSplits];
  __shared__ float merged[kKvMaxHeadDim];
  float big = -INFINITY;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x) big = fmaxf(big, first[s * stride]);
  big = block_max(big);
  float total = 0.0f;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
    const float m = first[s * stride], w = m == -INFINITY ? 0.0f : expf(m - big);
    weight[s] = w;
    total += w * first[s * stride + 1];
  }
  total = block_sum(total);  // its barriers also publish weight[]
  __shared__ float warp_sums[kWarps][kAttentionHeadDim];
  float o[kDimsPerLane] = {};
  if (warp < n_splits)
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) o[k] += early[k] * weight[warp];
#pragma unroll 4
  for (int s = warp + kWarps; s < n_splits; s += kWarps)
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k)
      if (lane + kWarp * k < head_dim) o[k] += first[s * stride + 2 + lane + kWarp * k] * weight[s];
#pragma unroll
  for (int k = 0; k < kDimsPerLane; ++k)
    if (lane + kWarp * k < head_dim) warp_sums[warp][lane + kWarp * k] = o[k];
  __syncthreads();
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += warp_sums[w][d];
    merged[d] = sum;
  }
  if constexpr (kRotatedValues) block_hadamard(merged, head_dim);
  else __syncthreads();
  if (int(threadIdx.x) < head_dim)
    out[int64_t(h) * head_dim + threadIdx.x] = merged[threadIdx.x] / total * sigmoidf(gate);
}


// Blocks of `kernel` the device runs at once (its multiprocessors times the blocks each holds).
template <class... Params>
int resident_blocks(void (*kernel)(Params...), int threads, int shared) {
  int device = 0, multiprocessors = 0, per_multiprocessor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, threads, shared) != cudaSuccess)
    return 1;
  return multiprocessors * per_multiprocessor;
}

// Launches a split-K kernel over (grid_x, splits) with splits as many as run in one wave, at most
// max_splits (partials' room): more would add waves and partials to merge, not bandwidth.
// A window's tokens take a third grid dimension, each with the splits one token has (so that each
// token's sums are those of its own launch).
template <class... Params, class... Args>
cudaError_t launch_splits(void (*kernel)(Params...), int grid_x, int tokens, int max_splits, int shared, void* stream,
                          int* splits, Args... args) {
  if (const cudaError_t err = allow_shared(kernel, size_t(shared))) return err;
  const int threads = kAttentionWarps * kWarp;
  *splits = std::clamp(resident_blocks(kernel, threads, shared) / grid_x, 1, max_splits);
  return launch_overlapped(kernel, dim3(grid_x, *splits, tokens), dim3(threads), size_t(shared), stream, args...);
}

}  // namespace

const char* attention_decode(const float* qg, KvView kv, const int64_t* pos, int n_heads, int n_kv_heads, int head_dim,
                             int n_splits, float* partials, float* out, void* stream, TokenRows tokens) {
  if (head_dim > kAttentionHeadDim || head_dim % 8 != 0) return "decode attention needs head_dim a multiple of 8, at most 256";
  if (tokens.n < 1 || tokens.n > 65535) return "decode attention of 1 to 65535 tokens";
  if (tokens.n == 1) tokens.in_stride = 0, tokens.out_stride = 0;
  if (n_heads % n_kv_heads != 0) return "query heads must be a multiple of the KV heads";
  if (n_splits < 1 || n_splits > kMaxAttentionSplits) return "attention splits out of range";
  const int group = n_heads / n_kv_heads, grid_x = n_kv_heads * ((group + kAttentionGroup - 1) / kAttentionGroup);
  return with_stores(kv.format, [&](auto stores) -> const char* {
    using S = decltype(stores);
    cudaError_t err = cudaSuccess;
    int splits = 0;
    bool tensor = false;
    if constexpr (kCellsOnTensorCores<S::k> && kCellsOnTensorCores<S::v>) {
      tensor = head_dim == 128 || head_dim == 256;
      if (head_dim == 256)
        err = launch_splits(attention_decode_tensor_kernel<S::k, S::v, 256>, grid_x, tokens.n, n_splits,
                            kTensorSharedBytes<S::k, S::v, 256>, stream, &splits, qg, kv, pos, n_heads,
                            n_kv_heads, partials, tokens.in_stride);
      else if (head_dim == 128)
        err = launch_splits(attention_decode_tensor_kernel<S::k, S::v, 128>, grid_x, tokens.n, n_splits,
                            kTensorSharedBytes<S::k, S::v, 128>, stream, &splits, qg, kv, pos, n_heads,
                            n_kv_heads, partials, tokens.in_stride);
    }
    if (!tensor)
      err = launch_splits(attention_decode_kernel<S::k, S::v>, grid_x, tokens.n, n_splits, 0, stream, &splits, qg, kv,
                          pos, n_heads, n_kv_heads, head_dim, partials, tokens.in_stride);
    if (err != cudaSuccess) return error_text(err);
    return error_text(launch_overlapped(attention_merge_kernel<KvSide<S::v>::rotated>, dim3(n_heads, tokens.n),
                                        dim3(kMergeThreads), 0, stream, qg, partials, pos,
                                        kv.row_sequence != nullptr, splits,
                                        tensor ? kTensorSplitKeys : kFloatSplitKeys, head_dim, out, tokens));
  });
}

}  // namespace lode::cuda::kernels
