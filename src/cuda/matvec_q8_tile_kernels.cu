// Products of 16 and more 8-bit inputs of one matrix on the tensor cores (decode rows of many
// sequences, or of one sequence's positions), for Q8_0 rows of 256 values and more, Q4_K, Q5_K and
// Q6_K: launch_matvec_q8 hands such launches here (q8_tiles_take). A warp takes 16 rows by 8 inputs
// (an mma tile) or by 16; where the tiles are few, several warps share one. Q8_0 rows of 8 or 16
// spans, and K-quant rows with 16 consecutive inputs or more (Q4_K and Q5_K: fewer than 32), go to
// kernels that copy a tile's rows whole into shared memory first and take 2 to 8 tiles of inputs a
// block (matvec_q8_0_staged_kernel, matvec_q8_staged_kernel).
//
// Every input's products keep the bits they get alone (matvec_q8_kernel, and the CPU miss path's
// twin, cpu/q8_twin.h):
// - a row is cut into units (a K-quant's 32-value slice; 8 Q8_0 blocks, a span), each one float
//   made from integer dot products and the unit's scales. Integer sums are exact in any order, so
//   int8 mma computes them; the float steps around them follow q8_slices.cuh step for step.
// - the single-input kernel sums a row's units over `lanes` lanes (lane l adds units l, l + lanes,
//   ... from 0), then in a butterfly (offsets lanes / 2, ..., 1). Here one lane holds a (row,
//   input)'s every unit, so it visits the leaves (those lanes' sums) in bit-reversed order: then the
//   butterfly's pairs complete one after another, and a stack of one partial sum per level adds each
//   pair as it completes, the butterfly's sums in its order (a + b and b + a are the same float).
//
// The leaves' order reads a row's units out of address order, so weights are read through L1 (a
// sector's other half serves another unit later from L1 or L2), and a warp first asks L2 for its
// rows whole.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/exact_math.h"
#include "core/quant/blocks.h"
#include "core/quant/q8_0_spans.h"
#include "cuda/async_copy.cuh"
#include "cuda/kernel_math.cuh"
#include "cuda/matvec_launch.h"
#include "cuda/q8_slices.cuh"

namespace lode::cuda {

namespace {

using namespace lode::quant;

using kernels::kWarp;

constexpr int kTileRows = 16, kTileInputs = 8;  // an mma tile: rows (M) by inputs (N)
constexpr int kTileWarps = 8;                   // a block's warps, one tile of rows each
constexpr int kMaxLevels = 6;                   // a butterfly of up to 32 lanes: 5 levels of pairs, and its sum

// Weight bytes through L1 (ld.global.nc).
struct FromCache {
  template <class W>
  __device__ static W at(const void* p) { return __ldg(static_cast<const W*>(p)); }
};

// C += A B, A 16 x 16 int8 (rows g and g + 8 of lane 4 g + t: a0, a1, k 4 t .. 4 t + 3), B 16 x 8
// (input g, the same k), C 16 x 8 int32 (rows g, g + 8 by inputs 2 t, 2 t + 1: c0 c1, c2 c3).
__device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b));
}

// The same with k 32: a0, a1 k 4 t .., a2, a3 k 16 + 4 t ..; b0, b1 likewise.
__device__ __forceinline__ void mma_k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, "
      "%3};"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The block's inputs rounded in shared memory (round_inputs_kernel's layout, q_bytes = cols), as a
// lane reads them: for each of kN tiles of inputs, B's input (g) and C's two (2 t, 2 t + 1), as
// byte offsets from the first input's (those past the last input read the last one's; their
// results are not stored).
template <int kN>
struct TileX {
  const int8_t* base;
  int b_at[kN], c_at[kN][2], cols;
  __device__ TileX(const int4* shared, int stride, int cols_, int last, int g, int t)
      : base(reinterpret_cast<const int8_t*>(shared)), cols(cols_) {
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      b_at[j] = min(kTileInputs * j + g, last) * stride * 16;
      c_at[j][0] = min(kTileInputs * j + 2 * t, last) * stride * 16;
      c_at[j][1] = min(kTileInputs * j + 2 * t + 1, last) * stride * 16;
    }
  }
  __device__ const int8_t* q(int j) const { return base + b_at[j]; }  // B's input's q
  // C element e's input's d and sum16.
  __device__ const float* d(int j, int e) const { return reinterpret_cast<const float*>(base + c_at[j][e % 2] + cols); }
  __device__ const int* sum16(int j, int e) const {
    return reinterpret_cast<const int*>(base + c_at[j][e % 2] + cols + cols / 8);
  }
};

// A lane's place in the tile: g = lane / 4 (A's rows g and g + 8, B's input g), t = lane % 4 (k
// slots; C's inputs 2 t and 2 t + 1). C's element e: row g + 8 (e / 2), input 2 t + e % 2.
struct TileLane {
  int g, t;
  __device__ int input(int tile, int e) const { return kTileInputs * tile + 2 * t + e % 2; }
};

// Each type's unit: kValues values of a row, in kSteps steps. load() reads a step's weight bytes of
// rows row[0] (g) and row[1] (g + 8) into registers (Raw); step() adds the step's float term to
// the lane's C elements' unit sums for each of kN tiles of inputs (a unit of one step sets it).
// The kernel keeps kDepth steps' loads in flight. kPad: each input's shared words are kPad past a
// multiple of 8 (128 bytes), so a warp's B loads (4 lanes an input, 16 bytes; Q8_0's 32 bytes, in
// two half-warp phases) meet different banks.
template <GgmlType T>
struct TileUnit;

// Q4_K and Q5_K slice s (k45_dot's): 16 qs bytes holding 16 values of sub-block 2 pair (low
// nibbles) and 16 of sub-block 2 pair + 1 (high); lane t takes bytes 4 t .. 4 t + 3, so one load
// gives A of both halves, each its own mma (the halves' scales differ).
template <bool kFifthBit>
struct K45Tile {
  static constexpr int kValues = 32, kSteps = 1, kDepth = kFifthBit ? 3 : 4, kPad = 1;  // (registers)
  static constexpr int kStagedTiles = 2;  // most tiles of 8 inputs a staged block takes (registers)
  static constexpr bool kReadsSums = true;  // x's sum16 (the mins' term)
  using Block = std::conditional_t<kFifthBit, BlockQ5_K, BlockQ4_K>;
  struct Raw {
    uint4 head[2];
    uint32_t q[2], fifth[2];
  };
  template <class M = FromCache>
  __device__ static Raw load(const uint8_t* const (&row)[2], int s, int, TileLane lane) {
    Raw raw;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const Block& b = reinterpret_cast<const Block*>(row[r])[s / 8];
      raw.head[r] = M::template at<uint4>(&b);
      raw.q[r] = M::template at<uint32_t>(b.qs + 16 * (s % 8) + 4 * lane.t);
      raw.fifth[r] = 0;
      if constexpr (kFifthBit) raw.fifth[r] = M::template at<uint32_t>(b.qh + 16 * (s % 2) + 4 * lane.t);
    }
    return raw;
  }
  template <int kN>
  __device__ static void step(const Raw& raw, int s, int, TileLane lane, const TileX<kN>& x, float (&unit)[kN][4]) {
    const int sb = s / 8, ss = s % 8, pair = ss / 2, t = lane.t;
    const int lo_base = 256 * sb + 64 * pair + 16 * (ss % 2), hi_base = lo_base + 32;
    int lo[2], hi[2];
    uint32_t scales[2], mins[2];
    float d[2], dmin[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      uint32_t l = raw.q[r] & 0x0f0f0f0fu, h = (raw.q[r] >> 4) & 0x0f0f0f0fu;
      if constexpr (kFifthBit) {
        l |= ((raw.fifth[r] >> (2 * pair)) & 0x01010101u) << 4;
        h |= ((raw.fifth[r] >> (2 * pair + 1)) & 0x01010101u) << 4;
      }
      lo[r] = int(l), hi[r] = int(h);
      const uint4 head = raw.head[r];
      scale_min_pair_k4(head.y, head.z, head.w, pair, &scales[r], &mins[r]);
      d[r] = __half2float(__ushort_as_half(uint16_t(head.x)));
      dmin[r] = __half2float(__ushort_as_half(uint16_t(head.x >> 16)));
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      const int8_t* bq = x.q(j);
      int clo[4] = {0, 0, 0, 0}, chi[4] = {0, 0, 0, 0};
      mma_k16(clo, lo[0], lo[1], *reinterpret_cast<const int*>(bq + lo_base + 4 * t));
      mma_k16(chi, hi[0], hi[1], *reinterpret_cast<const int*>(bq + hi_base + 4 * t));
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        const int* sum16 = x.sum16(j, e);
        const int scaled = int(scales[r] & 0xffu) * clo[e] + int(scales[r] >> 8) * chi[e];
        const int sum_mins = int(mins[r] & 0xffu) * sum16[lo_base / 16] + int(mins[r] >> 8) * sum16[hi_base / 16];
        unit[j][e] = exact::mul(x.d(j, e)[lo_base / 32],
                                exact::sub(exact::mul(d[r], float(scaled)), exact::mul(dmin[r], float(sum_mins))));
      }
    }
  }
};

template <>
struct TileUnit<GgmlType::Q4_K> : K45Tile<false> {};
template <>
struct TileUnit<GgmlType::Q5_K> : K45Tile<true> {};

// Q6_K slice s (Slice<Q6_K>'s): 8 values of each of a half's four quarters, each quarter's its own
// scale, so four mmas of k 16 whose slots 8 .. 15 are zero (lanes t >= 2); A holds the values less
// 32 (-32 .. 31), so each mma gives a quarter's dot - 32 sum.
template <>
struct TileUnit<GgmlType::Q6_K> {
  static constexpr int kValues = 32, kSteps = 1, kDepth = 3, kPad = 1;  // (registers)
  static constexpr int kStagedTiles = 4;
  static constexpr bool kReadsSums = false;
  struct Raw {
    uint32_t qa[2], qb[2], qh[2];
    uint2 scales[2];
    float d[2];
  };
  template <class M = FromCache>
  __device__ static Raw load(const uint8_t* const (&row)[2], int s, int, TileLane lane) {
    const int blk = s / 8, half = (s % 8) / 4, tq = s % 4, t = lane.t;
    Raw raw;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint8_t* block = row[r] + blk * int(sizeof(BlockQ6_K));
      raw.qa[r] = raw.qb[r] = raw.qh[r] = 0;
      if (t < 2) {
        const uint8_t* ql = block + 64 * half + 8 * tq + 4 * t;
        raw.qa[r] = uint32_t(u32_at_b2<M>(ql));
        raw.qb[r] = uint32_t(u32_at_b2<M>(ql + 32));
        raw.qh[r] = uint32_t(u32_at_b2<M>(block + offsetof(BlockQ6_K, qh) + 32 * half + 8 * tq + 4 * t));
      }
      raw.scales[r] = u64_at_b2<M>(block + offsetof(BlockQ6_K, scales) + 8 * half);
      raw.d[r] = half_at<M>(block + offsetof(BlockQ6_K, d));
    }
    return raw;
  }
  template <int kN>
  __device__ static void step(const Raw& raw, int s, int, TileLane lane, const TileX<kN>& x, float (&unit)[kN][4]) {
    const int blk = s / 8, tq = s % 4, t = lane.t;
    const int base = 256 * blk + 128 * ((s % 8) / 4) + 8 * tq;
    int a[2][4], scale[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t qa = raw.qa[r], qb = raw.qb[r], qh = raw.qh[r];
      const uint32_t u[4] = {(qa & 0x0f0f0f0fu) | ((qh & 0x03030303u) << 4),
                             (qb & 0x0f0f0f0fu) | (((qh >> 2) & 0x03030303u) << 4),
                             ((qa >> 4) & 0x0f0f0f0fu) | (((qh >> 4) & 0x03030303u) << 4),
                             ((qb >> 4) & 0x0f0f0f0fu) | (((qh >> 6) & 0x03030303u) << 4)};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        a[r][q] = t < 2 ? int(__vsub4(u[q], 0x20202020u)) : 0;
        const uint32_t word = q < 2 ? raw.scales[r].x : raw.scales[r].y;
        scale[r][q] = int(word << (24 - 8 * (tq / 2 + 2 * (q % 2)))) >> 24;  // the signed byte tq / 2 + 2 q
      }
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      const int8_t* bq = x.q(j) + base + 4 * t;
      int c[4][4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        c[q][0] = c[q][1] = c[q][2] = c[q][3] = 0;
        mma_k16(c[q], a[0][q], a[1][q], t < 2 ? *reinterpret_cast<const int*>(bq + 32 * q) : 0);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        int total = 0;
#pragma unroll
        for (int q = 0; q < 4; ++q) total += scale[r][q] * c[q][e];
        unit[j][e] = exact::mul(exact::mul(raw.d[r], x.d(j, e)[8 * blk]), float(total));
      }
    }
  }
};

// One Q8_0 block of rows g and g + 8 (A: their bytes 8 t .. 8 t + 7, w, and scales, d) against kN
// tiles of 8 inputs: tile j's B (input g's bytes 8 t .. of the block, x_q(j)) in an mma of k 32,
// and each C element's float term (d_w d_x) c, with its input's scale x_d(j, e), added to its sum
// as q8_0_span_dots adds it.
template <int kN, class XQ, class XD>
__device__ __forceinline__ void add_q8_0_block(float (&sum)[kN][4], const uint2 (&w)[2], const float (&d)[2],
                                               const XQ& x_q, const XD& x_d) {
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const int2 xv = x_q(j);
    int c[4] = {0, 0, 0, 0};
    mma_k32(c, int(w[0].x), int(w[1].x), int(w[0].y), int(w[1].y), xv.x, xv.y);
    const float xd[2] = {x_d(j, 0), x_d(j, 1)};
#pragma unroll
    for (int e = 0; e < 4; ++e) sum[j][e] = exact::add(sum[j][e], exact::mul(exact::mul(d[e / 2], xd[e % 2]), float(c[e])));
  }
}

// Q8_0 span s (q8_0_span_dots'): 8 blocks, a step each: an mma of k 32 (lane t: the block's bytes
// 8 t .. 8 t + 7, A's slots 4 t .. and 16 + 4 t ..), its float term added to the span's sum.
template <>
struct TileUnit<GgmlType::Q8_0> {
  static constexpr int kValues = kQ8_0SpanValues, kSteps = kQ8_0SpanBlocks, kDepth = 6, kPad = 2;  // (registers)
  struct Raw {
    uint2 w[2];
    float d[2];
  };
  template <class M = FromCache>
  __device__ static Raw load(const uint8_t* const (&row)[2], int s, int b, TileLane lane) {
    Raw raw;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint8_t* block = row[r] + (kQ8_0SpanBlocks * s + b) * int(sizeof(BlockQ8_0));
      raw.w[r] = u64_at_b2<M>(block + 2 + 8 * lane.t);
      raw.d[r] = half_at<M>(block);
    }
    return raw;
  }
  template <int kN>
  __device__ static void step(const Raw& raw, int s, int b, TileLane lane, const TileX<kN>& x, float (&unit)[kN][4]) {
    const int blk = kQ8_0SpanBlocks * s + b;
    add_q8_0_block(
        unit, raw.w, raw.d, [&](int j) { return *reinterpret_cast<const int2*>(x.q(j) + 32 * blk + 8 * lane.t); },
        [&](int j, int e) { return x.d(j, e)[blk]; });
  }
};

// The butterfly's partial sums, one per level: leaves pushed in bit-reversed order complete its
// pairs like carries in a binary counter (leaf number i adds the levels below i's lowest zero bit
// and is kept there).
template <int kN>
struct LeafStack {
  float level[kMaxLevels][kN][4];

  // Leaf number i's sum: added to the partial sums it completes (as many as i's trailing one bits),
  // then kept at the level after them (i is the warp's: the branches do not diverge).
  __device__ void push(int i, float (&sum)[kN][4]) {
    const int completes = __ffs(~i) - 1;
#pragma unroll
    for (int b = 0; b < kMaxLevels - 1; ++b) {
      if (b >= completes) break;
#pragma unroll
      for (int j = 0; j < kN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[j][e] = exact::add(level[b][j][e], sum[j][e]);
    }
#pragma unroll
    for (int b = 0; b < kMaxLevels; ++b)
      if (b == completes)
#pragma unroll
        for (int j = 0; j < kN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) level[b][j][e] = sum[j][e];
  }
  // The butterfly's result after all 2^levels leaves.
  __device__ void result(int levels, float (&sum)[kN][4]) const {
#pragma unroll
    for (int b = 0; b < kMaxLevels; ++b)
      if (b == levels)
#pragma unroll
        for (int j = 0; j < kN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) sum[j][e] = level[b][j][e];
  }
};

template <int kN>
__device__ __forceinline__ void set_zero(float (&v)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) v[j][e] = 0.0f;
}

// The leaves' sums of processing numbers `first` .. first + count - 1 (a subtree of the butterfly:
// count a power of two, first a multiple of it), each leaf's units in order, the steps' loads
// U::kDepth ahead (half that with two tiles of inputs); on return the stack's level log2(count)
// holds the subtree's sum.
template <class U, int kN>
__device__ void sum_leaves(const uint8_t* const (&row)[2], TileLane lane, const TileX<kN>& x, int lanes, int per_leaf,
                           int first, int count, LeafStack<kN>& stack) {
  constexpr int kDepth = kN == 1 ? U::kDepth : U::kDepth / 2;  // (two tiles: twice the work a step, and registers)
  const int levels = 31 - __clz(lanes), total = count * per_leaf * U::kSteps;
  // Where step k of the warp's is: leaf number i, the leaf's unit j, the unit's step b.
  struct Cursor {
    int i = 0, j = 0, b = 0;
    __device__ void next(int per_leaf) {
      if (++b < U::kSteps) return;
      b = 0;
      if (++j < per_leaf) return;
      j = 0, ++i;
    }
  };
  const auto unit_at = [&](const Cursor& c) {
    return (levels ? int(__brev(unsigned(first + c.i)) >> (32 - levels)) : 0) + lanes * c.j;
  };
  typename U::Raw ring[kDepth];
  Cursor at, ahead;  // the step computed, and the step loaded kDepth after it
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    if (d < total) ring[d] = U::load(row, unit_at(ahead), ahead.b, lane);
    ahead.next(per_leaf);
  }
  float unit[kN][4], leaf[kN][4];
  set_zero(unit), set_zero(leaf);
  for (int k0 = 0; k0 < total; k0 += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (k0 + d >= total) break;
      const typename U::Raw raw = ring[d];
      if (k0 + d + kDepth < total) {
        ring[d] = U::load(row, unit_at(ahead), ahead.b, lane);
        ahead.next(per_leaf);
      }
      if (at.b == 0) set_zero(unit);
      U::template step<kN>(raw, unit_at(at), at.b, lane, x, unit);
      const Cursor was = at;
      at.next(per_leaf);
      if (was.b < U::kSteps - 1) continue;
#pragma unroll
      for (int j = 0; j < kN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) leaf[j][e] = exact::add(leaf[j][e], unit[j][e]);
      if (was.j < per_leaf - 1) continue;
      stack.push(was.i, leaf);
      set_zero(leaf);
    }
  }
}

// Block (c, r): tiles of 16 rows, 8 / split of them (rows 128 / split r ..), each by `split` warps
// that sum a part of its leaves (a subtree of the butterfly; the parts meet in shared memory, in the
// butterfly's order), for inputs 8 kN c .. + 8 kN - 1 (as many as there are). Blocks of one row
// tile side by side in x, so a matrix read for several tiles of inputs comes from L2 the second
// time.
template <class U, int kN>
__global__ void __launch_bounds__(kTileWarps* kWarp, 2)
    matvec_q8_tiles_kernel(const uint8_t* matrix, int64_t rows, int64_t cols, size_t row_bytes, ProblemIo io,
                           float* y, int lanes, int split, int64_t n_problems, const int4* rounded, int stride) {
  extern __shared__ int4 shared_x[];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, part = warp % split;
  const int64_t first = (int64_t(blockIdx.y) * (kTileWarps / split) + warp / split) * kTileRows;
  const int64_t p = int64_t(blockIdx.x) * kTileInputs * kN;
  const auto row_of = [&](int64_t r) { return min(r, rows - 1); };  // rows past the end: the last row
  if (first < rows && part == 0)  // the tile's rows asked of L2 while the kernel before finishes
    kernels::prefetch_lines(matrix + first * int64_t(row_bytes), min(int64_t(kTileRows), rows - first) * int64_t(row_bytes),
                            lane, kWarp);
  kernels::begin_after_inputs();
  const int inputs = int(min(int64_t(kTileInputs * kN), n_problems - p));
  const size_t words = rounded_x_words(size_t(cols), cols);
  for (int i = 0; i < inputs; ++i) copy_rounded(shared_x + i * stride, rounded + io.input(p + i) * words, words);
  __syncthreads();

  // (Tiles past the last row sum the last row again, unstored: every warp reaches the barrier.)
  const TileLane tl{lane / 4, lane % 4};
  const TileX<kN> x(shared_x, stride, int(cols), inputs - 1, tl.g, tl.t);
  const uint8_t* const row[2] = {matrix + row_of(first + tl.g) * row_bytes, matrix + row_of(first + tl.g + 8) * row_bytes};
  const int per_part = lanes / split, part_levels = 31 - __clz(per_part);
  LeafStack<kN> stack;
  sum_leaves<U, kN>(row, tl, x, lanes, int(cols / U::kValues) / lanes, part * per_part, per_part, stack);
  float result[kN][4];
  stack.result(part_levels, result);
  if (split > 1) {  // the parts' sums through shared memory, after the inputs
    float* parts = reinterpret_cast<float*>(shared_x + kN * kTileInputs * stride);
    const auto at = [&](int w_, int j, int e) { return parts + ((w_ * kN + j) * 4 + e) * kWarp + lane; };
#pragma unroll
    for (int j = 0; j < kN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) *at(warp, j, e) = result[j][e];
    __syncthreads();
    if (part != 0) return;
    LeafStack<kN> top;
    for (int q = 0; q < split; ++q) {
#pragma unroll
      for (int j = 0; j < kN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) result[j][e] = *at(warp + q, j, e);
      top.push(q, result);
    }
    top.result(31 - __clz(split), result);
  }
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t r = first + tl.g + 8 * (e / 2);
      const int i = tl.input(j, e);
      if (r >= rows || i >= inputs) continue;
      y[(p + i) * io.y_stride + r] = result[j][e];
    }
}

// The staged kernels' end: each of the eight warps' sums of its leaves [kN][4] (the butterfly's
// levels inside the warp done) met in the butterfly's last three levels (offsets 4, 2, 1) through
// shared memory at `sums` (which may hold the staged rows until every warp is done with them), and
// stored by warp 0: rows first + g and + 8, inputs p + 8 j + 2 t and + 1, those inside rows and
// inputs.
template <int kN>
__device__ void store_warps_sums(const float (&mine)[kN][4], float* sums, TileLane tl, int64_t first, int64_t rows,
                                 int64_t p, int inputs, const ProblemIo& io, float* y) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const auto at = [&](int w_, int j, int e) -> float& { return sums[((w_ * kN + j) * 4 + e) * kWarp + lane]; };
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) at(warp, j, e) = mine[j][e];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float a = exact::add(at(0, j, e), at(4, j, e)), b = exact::add(at(2, j, e), at(6, j, e));
      const float c = exact::add(at(1, j, e), at(5, j, e)), d = exact::add(at(3, j, e), at(7, j, e));
      const int64_t r = first + tl.g + 8 * (e / 2);
      const int i = tl.input(j, e);
      if (r < rows && i < inputs) y[(p + i) * io.y_stride + r] = exact::add(exact::add(a, b), exact::add(c, d));
    }
}

// Q8_0 rows of 8 or 16 spans (2,048 or 4,096 values: the DeltaNet and attention products of the
// 35B) with kTiles tiles of 8 inputs a block: block (c, r) takes the 16 rows of tile r and inputs
// 8 kTiles c ..; warp w the butterfly's leaves w and w + 8 (a leaf is one span here), whose rows it
// copies whole into shared memory by cp.async before the wait for the kernel before (the weights
// depend on nothing), so a tile's 35-70 KB are on their way at once instead of a few steps' loads a
// warp. A span's 8 blocks are 8 mmas of k 32 for each tile of inputs (A from the staged rows, B and
// the inputs' scales read through L1 from the rounded inputs), each block's float term added to the
// span's sum in order; a warp adds its two leaves (the butterfly's first level where there are 16),
// and warp 0 the eight warps' sums in the butterfly's order. The bits are q8_0_span_dots' and the
// spans kernel's, as the tiles' above. More tiles a block read a row tile's bytes (from L2 after
// the first block) fewer times and unpack nothing twice: q8_0_staged_tiles picks them.
constexpr int kStagedWarps = 8;
constexpr int kStagedRowBytes = kQ8_0SpanBlocks * int(sizeof(BlockQ8_0));  // a span of one row: 272

template <int kSpans, int kTiles>  // a warp's spans (leaves): 1 or 2; tiles of 8 inputs a block
__global__ void __launch_bounds__(kStagedWarps* kWarp, 2)
    matvec_q8_0_staged_kernel(const uint8_t* matrix, int64_t rows, int64_t cols, size_t row_bytes, ProblemIo io,
                              float* y, int64_t n_problems, const int4* rounded) {
  extern __shared__ int4 staged_words[];
  constexpr int kTileBytes = kTileRows * kStagedRowBytes;  // one span of the tile's 16 rows
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t first = int64_t(blockIdx.y) * kTileRows, p = int64_t(blockIdx.x) * kTileInputs * kTiles;
  uint8_t* const mine = reinterpret_cast<uint8_t*>(staged_words) + size_t(warp) * kSpans * kTileBytes;
  // The warp's spans w, w + 8 of the tile's rows (rows past the end: the last row again, unstored).
  for (int c = lane; c < kSpans * kTileBytes / 16; c += kWarp) {
    const int k = c / (kTileBytes / 16), in_tile = c % (kTileBytes / 16);
    const int r = in_tile / (kStagedRowBytes / 16), word = in_tile % (kStagedRowBytes / 16);
    const int span = warp + kStagedWarps * k;
    const uint8_t* from = matrix + min(first + r, rows - 1) * int64_t(row_bytes) + span * kStagedRowBytes + 16 * word;
    copy_async<16, true>(mine + 16 * c, from, true);
  }
  kernels::begin_after_inputs();
  const TileLane tl{lane / 4, lane % 4};
  const int inputs = int(min(int64_t(kTileInputs * kTiles), n_problems - p));
  const size_t words = rounded_x_words(size_t(cols), cols);
  // B's input (g) and C's two (2 t, 2 t + 1) of each tile of inputs: byte offsets of their q and
  // of their scales from the rounded inputs' start (32 bits: registers for eight tiles).
  const int8_t* const base = reinterpret_cast<const int8_t*>(rounded);
  uint32_t bq[kTiles], cd[kTiles][2];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const auto at = [&](int i) { return uint32_t(io.input(p + min(i, inputs - 1)) * words * 16); };
    bq[j] = at(kTileInputs * j + tl.g);
    cd[j][0] = at(kTileInputs * j + 2 * tl.t) + uint32_t(cols);
    cd[j][1] = at(kTileInputs * j + 2 * tl.t + 1) + uint32_t(cols);
  }
  copies_arrived();
  __syncwarp();
  float leaf[kSpans][kTiles][4];
#pragma unroll
  for (int k = 0; k < kSpans; ++k) {
    const int span = warp + kStagedWarps * k;
    const uint8_t* const row[2] = {mine + k * kTileBytes + tl.g * kStagedRowBytes,
                                   mine + k * kTileBytes + (tl.g + 8) * kStagedRowBytes};
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) leaf[k][j][e] = 0.0f;
#pragma unroll
    for (int b = 0; b < kQ8_0SpanBlocks; ++b) {
      const int blk = kQ8_0SpanBlocks * span + b;
      const auto a = TileUnit<GgmlType::Q8_0>::load<FromShared>(row, 0, b, tl);  // (row: the span's staged bytes)
      add_q8_0_block(
          leaf[k], a.w, a.d, [&](int j) { return __ldg(reinterpret_cast<const int2*>(base + bq[j] + 32 * blk + 8 * tl.t)); },
          [&](int j, int e) { return __ldg(reinterpret_cast<const float*>(base + cd[j][e]) + blk); });
    }
  }
  // The butterfly: leaves w and w + 8 first (offset 8 of 16), then the warps' sums (offsets 4, 2, 1).
  float leaves_sum[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      leaves_sum[j][e] = kSpans == 2 ? exact::add(leaf[0][j][e], leaf[kSpans - 1][j][e]) : leaf[0][j][e];
  store_warps_sums(leaves_sum, reinterpret_cast<float*>(staged_words), tl, first, rows, p, inputs, io, y);
}

// The spans a warp of the staged kernel takes for a Q8_0 row of `cols` values; 0 where it does not
// take them (rows of other than 8 or 16 spans).
int staged_spans_a_warp(int64_t cols) {
  const int64_t spans = cols / kQ8_0SpanValues;
  return cols % kQ8_0SpanValues == 0 && (spans == 8 || spans == 16) ? int(spans / kStagedWarps) : 0;
}

// Tiles of 8 inputs a block of the staged kernel takes: as many as the inputs fill (2, 4 or 8),
// fewer where the blocks would not fill every multiprocessor twice (the 2,048 rows of an attention
// or DeltaNet output). On an H100 (bench_cuda_matvec inputs, stop 63), DeltaNet's qkv with 64
// inputs took 42.0-42.4 us with 8 tiles a block, 46.4 with 4, 54.5 with 2.
int q8_0_staged_tiles(const MatvecLaunch& m) {
  const int64_t needed = (m.n_problems + kTileInputs - 1) / kTileInputs, row_tiles = (m.rows + kTileRows - 1) / kTileRows;
  int tiles = 2;
  while (tiles < 8 && 2 * tiles <= needed &&
         row_tiles * ((needed + 2 * tiles - 1) / (2 * tiles)) >= 2 * int64_t(kernels::multiprocessors()))
    tiles *= 2;
  return tiles;
}

template <int kSpans, int kTiles>
cudaError_t launch_q8_0_staged(const MatvecLaunch& m) {
  const auto kernel = matvec_q8_0_staged_kernel<kSpans, kTiles>;
  // (the rows, then the warps' sums of store_warps_sums)
  const size_t shared = std::max(size_t(kStagedWarps) * kSpans * kTileRows * kStagedRowBytes,
                                 size_t(kStagedWarps) * kTiles * 4 * kWarp * sizeof(float));
  if (const cudaError_t err = kernels::allow_shared(kernel, shared)) return err;
  const int64_t per_block = int64_t(kTileInputs) * kTiles;
  const dim3 grid(unsigned((m.n_problems + per_block - 1) / per_block), unsigned((m.rows + kTileRows - 1) / kTileRows));
  return kernels::launch_overlapped(kernel, grid, dim3(kStagedWarps * kWarp), shared, m.stream,
                                    static_cast<const uint8_t*>(m.w), m.rows, m.cols, m.row_bytes, m.io, m.y,
                                    m.n_problems, static_cast<const int4*>(m.rounded));
}

template <int kSpans>
cudaError_t launch_q8_0_staged(const MatvecLaunch& m) {
  switch (q8_0_staged_tiles(m)) {
    case 8: return launch_q8_0_staged<kSpans, 8>(m);
    case 4: return launch_q8_0_staged<kSpans, 4>(m);
    default: return launch_q8_0_staged<kSpans, 2>(m);
  }
}

// K-quant rows staged whole, for 16 inputs and more (stop 61; the lm head of a step of 16 or 64
// sequences): block (c, r) copies the 16 rows of tile r into shared memory by cp.async before its
// wait (a unit's bytes lie all over its super-block, so the warps share the copy), and they are
// read once from DRAM, where matvec_q8_tiles_kernel reads each warp's steps a few at a time through
// L1 and, its units out of address order, brought the lm head's rows from DRAM about seven times
// over (Nsight Compute, 16 inputs on an H100: 3 GB moved for its 417 MB, 1.28 ms). Warp w then
// takes the butterfly's leaves w, w + 8, ... (kLeaves of them), each leaf's units in order for kN
// tiles of 8 inputs (A from the staged rows, unpacked once for all of them; B and the inputs'
// scales from their words copied into shared memory after the wait, each input's padded so that
// an mma's 8 inputs meet different banks), adds its leaves in the butterfly's first levels, and
// warp 0 the eight warps' sums in its last three. B read in place from the rounded inputs (through
// L1) had 8 inputs' lines in every load: Nsight Compute found the lm head with 64 inputs bound by
// L1 (78.7% busy, 55% of its sectors excess; H100, stop 67), 2,041 us against 1,802-1,816 with B in
// shared memory (16 inputs: 617 against 596-601). Q8_0 rows through this kernel were slower than
// through the one above (DeltaNet qkv with 16 inputs 31.7 us against 26.2 on that H100).
constexpr size_t kStagedMostBytes = 96 << 10;  // a tile's rows at most (Q4_K rows of 21,504 values stay above)

template <class U, int kLeaves, int kN>
__global__ void __launch_bounds__(kStagedWarps* kWarp, 2)
    matvec_q8_staged_kernel(const uint8_t* matrix, int64_t rows, int64_t cols, size_t row_bytes, ProblemIo io,
                            float* y, int per_leaf, int64_t n_problems, const int4* rounded, int x_copied, int x_stride) {
  extern __shared__ int4 staged_words[];
  constexpr int kLanes = kLeaves * kStagedWarps;  // the butterfly's leaves
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t first = int64_t(blockIdx.y) * kTileRows, p = int64_t(blockIdx.x) * kTileInputs * kN;
  uint8_t* const tile = reinterpret_cast<uint8_t*>(staged_words);
  const int row_words = int(row_bytes / 16);
  for (int c = threadIdx.x; c < kTileRows * row_words; c += kStagedWarps * kWarp) {  // (past the end: the last row)
    const int64_t r = min(first + c / row_words, rows - 1);
    copy_async<16, true>(tile + 16 * c, matrix + r * int64_t(row_bytes) + 16 * (c % row_words), true);
  }
  kernels::begin_after_inputs();
  const int inputs = int(min(int64_t(kTileInputs * kN), n_problems - p));
  const int words = int(rounded_x_words(size_t(cols), cols));
  const TileLane tl{lane / 4, lane % 4};
  int4* const x_shared = staged_words + kTileRows * row_words;
  for (int c = threadIdx.x; c < inputs * x_copied; c += kStagedWarps * kWarp) {  // x_stride words apart
    const int i = c / x_copied, w = c % x_copied;
    copy_async<16>(x_shared + i * x_stride + w, rounded + (io.input(p) + i) * words + w, true);
  }
  const TileX<kN> x(x_shared, x_stride, int(cols), inputs - 1, tl.g, tl.t);
  copies_arrived();
  __syncthreads();
  const uint8_t* const row[2] = {tile + tl.g * row_bytes, tile + (tl.g + 8) * row_bytes};
  float leaf[kLeaves][kN][4];
#pragma unroll
  for (int k = 0; k < kLeaves; ++k) {
    set_zero(leaf[k]);
    for (int jj = 0; jj < per_leaf; ++jj) {
      const int unit = warp + kStagedWarps * k + kLanes * jj;
      float sum[kN][4];
      set_zero(sum);
#pragma unroll
      for (int b = 0; b < U::kSteps; ++b)
        U::template step<kN>(U::template load<FromShared>(row, unit, b, tl), unit, b, tl, x, sum);
#pragma unroll
      for (int j = 0; j < kN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) leaf[k][j][e] = exact::add(leaf[k][j][e], sum[j][e]);
    }
  }
  // The butterfly's levels within the warp (leaves 8 k apart: offsets kLanes / 2 .. 8), then across
  // the warps (offsets 4, 2, 1) through shared memory.
#pragma unroll
  for (int o = kLeaves / 2; o > 0; o /= 2)
#pragma unroll
    for (int k = 0; k < o; ++k)
#pragma unroll
      for (int j = 0; j < kN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) leaf[k][j][e] = exact::add(leaf[k][j][e], leaf[k + o][j][e]);
  store_warps_sums(leaf[0], reinterpret_cast<float*>(staged_words), tl, first, rows, p, inputs, io, y);
}

// Words `words` rounded up to `pad` past a multiple of 8 (an input's shared words, so that the
// lanes of an mma's B, 8 inputs apart, meet different banks).
int padded_words(int words, int pad) { return words + ((pad - words % 8) + 8) % 8; }

// An input's shared words in the tiles kernel: its rounded words, padded.
int tile_stride(int64_t cols, int pad) { return padded_words(int(rounded_x_words(size_t(cols), cols)), pad); }

// The staged kernel's shared memory: a tile's rows, then its kN tiles of inputs' words that the unit
// reads (q and d, and sum16 where it reads them: copied, the words each input's x_stride apart);
// the warps' sums reuse it at the end.
template <class U>
struct StagedShared {
  int x_copied, x_stride;
  size_t bytes;
  StagedShared(const MatvecLaunch& m, int n) {
    const size_t cols = size_t(m.cols);
    x_copied = int(U::kReadsSums ? rounded_x_words(cols, m.cols) : rounded_x_words_before_sums(cols, m.cols));
    x_stride = padded_words(x_copied, U::kPad);
    bytes = std::max(size_t(kTileRows) * m.row_bytes + size_t(n * kTileInputs) * size_t(x_stride) * 16,
                     size_t(kStagedWarps * n * 4 * kWarp) * sizeof(float));
  }
  bool fits() const { return bytes <= kernels::max_shared_per_block(); }
};

// A warp's leaves where the staged K-quant kernel takes a launch (0 where it does not): 16 inputs
// or more (fewer than 32 where a block takes at most two tiles of them: on an H100, Q4_K rows of
// 2,048 values with 64 inputs took 89.4 us staged, two tiles a block, against 83.0 through
// matvec_q8_tiles_kernel; with 16 inputs 31.5 against 38.0 with one tile a block), consecutive ones
// (a plain matrix's rows of several sequences), a butterfly of 8 leaves or more, a tile's rows in
// whole 16-byte words that fit kStagedMostBytes, and room for them and two tiles of inputs.
template <class U>
int staged_leaves(const MatvecLaunch& m) {
  const int lanes = lanes_for(m.cols / U::kValues);
  const bool inputs = m.n_problems >= 2 * kTileInputs && (U::kStagedTiles >= 4 || m.n_problems < 4 * kTileInputs);
  const bool consecutive = m.io.x_stride != 0 && m.io.x_run == 1 && m.io.x_inputs >= m.n_problems;
  const bool fits = m.row_bytes % 16 == 0 && size_t(kTileRows) * m.row_bytes <= kStagedMostBytes &&
                    reinterpret_cast<uintptr_t>(m.w) % 16 == 0 && StagedShared<U>(m, 2).fits();
  return U::kSteps == 1 && inputs && lanes >= kStagedWarps && consecutive && fits ? lanes / kStagedWarps : 0;
}

template <class U, int kLeaves, int kN>
cudaError_t launch_staged(const MatvecLaunch& m) {
  const auto kernel = matvec_q8_staged_kernel<U, kLeaves, kN>;
  const StagedShared<U> shared(m, kN);
  if (const cudaError_t err = kernels::allow_shared(kernel, shared.bytes)) return err;
  const int64_t lanes = kLeaves * kStagedWarps, per_block = int64_t(kN) * kTileInputs;
  const dim3 grid(unsigned((m.n_problems + per_block - 1) / per_block), unsigned((m.rows + kTileRows - 1) / kTileRows));
  return kernels::launch_overlapped(kernel, grid, dim3(kStagedWarps * kWarp), shared.bytes, m.stream,
                                    static_cast<const uint8_t*>(m.w), m.rows, m.cols, m.row_bytes, m.io, m.y,
                                    int(m.cols / U::kValues / lanes), m.n_problems, static_cast<const int4*>(m.rounded),
                                    shared.x_copied, shared.x_stride);
}

// The staged K-quant kernel with tiles of 8 inputs a block as the inputs fill (2 from 16 inputs, 4
// from 32 where the unit's registers allow: Q6_K's; the others' spill): a tile's rows are staged,
// and each unit unpacked, once for that many inputs. On an H100 (bench_cuda_matvec inputs, stop
// 63) the lm head with 16 inputs took 614-617 us against 862 with a tile a block, with 64 inputs
// 2,041-2,072 (2,448 with two tiles a block, 2,918 through matvec_q8_tiles_kernel), before B came
// from shared memory.
template <class U, int kLeaves>
cudaError_t launch_staged(const MatvecLaunch& m) {
  if constexpr (U::kStagedTiles >= 4)
    if (m.n_problems >= 4 * kTileInputs && StagedShared<U>(m, 4).fits()) return launch_staged<U, kLeaves, 4>(m);
  return launch_staged<U, kLeaves, 2>(m);
}

// Tiles of inputs a block takes: two where a plain matrix has more than 8 inputs, their x fit
// twice in a multiprocessor, and the tiles of rows are many (the lm head, the DeltaNet input).
template <class Unit>
int tiles_of_inputs(const MatvecLaunch& m) {
  const size_t two = size_t(2 * kTileInputs) * size_t(tile_stride(m.cols, Unit::kPad)) * 16;
  const int64_t tiles = (m.rows + kTileRows - 1) / kTileRows * ((m.n_problems + 2 * kTileInputs - 1) / (2 * kTileInputs));
  return m.n_problems > kTileInputs && two <= kernels::max_shared_per_block() / 2 &&
                 tiles >= 4 * int64_t(kernels::multiprocessors())
             ? 2
             : 1;
}

// Warps that share a tile (split its leaves): enough warps for every multiprocessor's 16 where the
// tiles are few (the 2,048 rows of an attention or DeltaNet output for 16 sequences), at most a
// warp per leaf and 8.
int split_for(int64_t tiles, int lanes) {
  int split = 1;
  const int64_t enough = 16 * int64_t(kernels::multiprocessors());
  while (split < kTileWarps && split * 2 <= lanes && tiles * split < enough) split *= 2;
  return split;
}

template <class U, int kN>
cudaError_t launch_tiles(const MatvecLaunch& m) {
  const auto kernel = matvec_q8_tiles_kernel<U, kN>;
  const int stride = tile_stride(m.cols, U::kPad), lanes = lanes_for(m.cols / U::kValues);
  const int64_t per_block = int64_t(kN) * kTileInputs, row_tiles = (m.rows + kTileRows - 1) / kTileRows;
  const int64_t columns = (m.n_problems + per_block - 1) / per_block;
  const int split = split_for(row_tiles * columns, lanes);
  const size_t shared = size_t(kN * kTileInputs) * size_t(stride) * 16 +
                        (split > 1 ? size_t(kTileWarps) * kN * 4 * kWarp * sizeof(float) : 0);
  if (const cudaError_t err = kernels::allow_shared(kernel, shared)) return err;
  const int64_t block_rows = int64_t(kTileWarps / split) * kTileRows;
  const dim3 grid(unsigned(columns), unsigned((m.rows + block_rows - 1) / block_rows));
  return kernels::launch_overlapped(kernel, grid, dim3(kTileWarps * kWarp), shared, m.stream,
                                    static_cast<const uint8_t*>(m.w), m.rows, m.cols, m.row_bytes, m.io, m.y, lanes,
                                    split, m.n_problems, static_cast<const int4*>(m.rounded), stride);
}

// f(TileUnit<T>{}) for a type the tiles read; false for others (the one list of them).
template <class F>
bool with_tile_unit(GgmlType type, F&& f) {
  switch (type) {
    case GgmlType::Q8_0: f(TileUnit<GgmlType::Q8_0>{}); return true;
    case GgmlType::Q4_K: f(TileUnit<GgmlType::Q4_K>{}); return true;
    case GgmlType::Q5_K: f(TileUnit<GgmlType::Q5_K>{}); return true;
    case GgmlType::Q6_K: f(TileUnit<GgmlType::Q6_K>{}); return true;
    default: return false;
  }
}

// The fewest inputs the tiles take. On the H200 (the 35B synth, lode bench --profile, us a launch,
// the CUDA-core kernels against the tiles; those at 16 and 64 inputs from before inputs were
// rounded once, docs/SERVER.md): 4 inputs, DeltaNet qkv 25.4 against 37.9 and the lm head 307
// against 968; 16 inputs, 57.0 against 51.1, 1,545 against 1,107, DeltaNet out 32.9 against 25.9;
// 64 inputs, 243 against 117, 5,004 against 3,229, DeltaNet out 154 against 68. (Expert groups, a
// step's few rows an expert, stay with the CUDA-core kernels: at 16 sequences the tiles took 124,
// 119 and 111 us a layer for gate, up and down, against 103 for gate|up and 90 for down a pair at a
// time.)
constexpr int kTilesFromInputs = 16;

}  // namespace

bool q8_tiles_take(const MatvecLaunch& m) {
  if (!m.q8_input || m.table || m.groups || m.n_problems < kTilesFromInputs) return false;
  bool takes = false;
  with_tile_unit(m.type, [&](auto unit) {
    using U = decltype(unit);
    // Whole super-blocks (Q8_0: whole spans, quant::q8_0_in_spans), every leaf the same count of
    // units (rows whose units are not a multiple of their lanes stay with the single-row kernels),
    // and 8 inputs' x and the parts' sums in shared memory.
    const int64_t units = m.cols / U::kValues;
    takes = m.cols % 256 == 0 && (m.type != GgmlType::Q8_0 || q8_0_in_spans(m.cols)) &&
            units % lanes_for(units) == 0 &&
            size_t(kTileInputs) * size_t(tile_stride(m.cols, U::kPad)) * 16 +
                    size_t(kTileWarps) * 4 * kWarp * sizeof(float) <=
                kernels::max_shared_per_block();
  });
  return takes;
}

cudaError_t launch_q8_tiles(const MatvecLaunch& m) {
  if (m.type == GgmlType::Q8_0) {
    const int spans = staged_spans_a_warp(m.cols);
    if (spans == 1) return launch_q8_0_staged<1>(m);
    if (spans == 2) return launch_q8_0_staged<2>(m);
  }
  cudaError_t err = cudaErrorInvalidValue;
  with_tile_unit(m.type, [&](auto unit) {
    using U = decltype(unit);
    if constexpr (U::kSteps == 1) {  // (the K-quants)
      switch (staged_leaves<U>(m)) {
        case 1: err = launch_staged<U, 1>(m); return;
        case 2: err = launch_staged<U, 2>(m); return;
        case 4: err = launch_staged<U, 4>(m); return;
        default: break;
      }
    }
    err = tiles_of_inputs<U>(m) == 2 ? launch_tiles<U, 2>(m) : launch_tiles<U, 1>(m);
  });
  return err;
}

}  // namespace lode::cuda
