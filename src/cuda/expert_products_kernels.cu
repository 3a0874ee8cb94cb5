// The kernels behind cuda/expert_products.h. A block computes 128 weight rows (output columns) x
// one tile of at most 128 x rows, in steps of 64 values along the rows, as D = W X^T: the weights
// are the tensor cores' A operand, so each lane expands its own fragments in registers, and only x
// passes through shared memory as the B operand (mma.sync m16n8k8 tf32; four warps of 32 weight
// rows). A step's 64 values are taken in an order of our own: slot s of substep j is value
// 16 s + 2 j, slot s + 4 value 16 s + 2 j + 1 (the same for both operands, so the sum is the same
// dot product), which gives each lane 16 consecutive values of a weight row per step: one 16-byte
// load of a k-quant's codes. The weights' stored bytes come into shared memory by cp.async with
// x's next step. x comes rounded to tf32 (kernels::gather_rows, swiglu_rows).
//
// Two kernels, one arithmetic: for every type, each sum runs over the steps and substeps in the
// same order with the same expanded values, so both give the same bits.
// - The codes kernel: the k-quants of the common recipes (Q4_K, Q5_K) and Q8_0 stage only the
//   pieces of a row that a step reads and expand their values two at a time, per substep, from
//   codes held in registers; so a warp's values serve all 128 x rows of the tile, halving the
//   expansion per product (the kernel's cost: Nsight Compute found the 64-row version bound by its
//   instruction stream). Tiles of a few rows go to a form of it that holds 32 (kSmallTileRows).
// - Every other type expands its 16 values of a step up front through its unit and serves 64 x
//   rows at a time, a tile in one or two passes.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/async_copy.cuh"
#include "cuda/expand_units.cuh"
#include "cuda/expert_products.h"
#include "cuda/kernel_math.cuh"

namespace lode::cuda {

namespace {

using expand::Expand;
using kernels::as_stream;
using kernels::blocks_for;
using kernels::error_text;

constexpr int kTileRows = 128;  // x rows per tile
constexpr int kRows = 64;       // x rows per pass of the units' kernel
constexpr int kCols = 128;      // weight rows (output columns) per block: 32 per warp
constexpr int kStep = 64;       // values along the rows per step
constexpr int kThreads = 128;
// x in shared memory: a row's four 16-value pieces at 18 s, rows 72 floats apart, so that the 8-byte
// loads of (row g, piece t, values 2 j and 2 j + 1) by each half warp hit 32 different banks. Pieces
// 0 and 2 arrive in 16-byte copies, 1 and 3 (8-byte aligned) in 8-byte ones.
constexpr int kXPitch = 72;
__host__ __device__ constexpr int x_piece(int s) { return 18 * s; }
static_assert(kTileRows == kExpertTileRows && kTileRows % kRows == 0);

// A raw stage of type T: whole blocks covering at least one step, and its room per weight row in
// shared memory (16-byte pieces; one more where a stage need not start on a 16-byte boundary; an
// odd number, so that the rows' loads spread over the banks).
template <GgmlType T>
struct Raw {
  static constexpr int kValues = Expand<T>::kValues > kStep ? Expand<T>::kValues : kStep;
  static constexpr int kSteps = kValues / kStep;
  static constexpr size_t kBytes = size_t(kValues / Expand<T>::kValues) * Expand<T>::kBytes;
  static constexpr int kPieces0 = int((kBytes + 15) / 16) + (kBytes % 16 == 0 ? 0 : 1);
  static constexpr int kPieces = kPieces0 % 2 == 1 ? kPieces0 : kPieces0 + 1;
  static constexpr size_t kPitchBytes = size_t(kPieces) * 16;
  // x's two steps, two raw stages.
  static constexpr size_t kShared = size_t(2) * kRows * kXPitch * sizeof(float) + size_t(2) * kCols * kPitchBytes;
};

// Values [v0, v0 + 16) of a raw stage's row (v0 a multiple of 16) through the type's unit (the
// unit's other half computed and dropped).
template <GgmlType T>
struct Sixteen {
  __device__ static void values(const uint8_t* stage, int v0, float* v) {
    float unit[32];
    Expand<T>::unit(stage, v0 / 32, unit);
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = (v0 % 32) ? unit[16 + i] : unit[i];
  }
};

// Sub-block j's 6-bit scale and min from a Q4_K/Q5_K block's 12 scale bytes (three words).
__device__ __forceinline__ void k4_scale_min(const uint32_t* words, int j, float* scale, float* min) {
  const auto byte = [&](int i) {  // selects, not an indexed array: that would live on the stack
    const uint32_t word = i < 4 ? words[0] : i < 8 ? words[1] : words[2];
    return int((word >> (8 * (i % 4))) & 0xff);
  };
  if (j < 4) {
    *scale = float(byte(j) & 63), *min = float(byte(j + 4) & 63);
  } else {
    *scale = float((byte(j + 4) & 0x0f) | ((byte(j - 4) >> 6) << 4));
    *min = float((byte(j + 4) >> 4) | ((byte(j) >> 6) << 4));
  }
}

__device__ __forceinline__ uint32_t to_tf32(float v) { return __float_as_uint(kernels::tf32_rounded(v)); }

// c += a b for one m16n8k8 tile (the PTX ISA's fragment layouts).
__device__ __forceinline__ void mma_tf32(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ const uint8_t* line_start(const uint8_t* p) {
  return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15));
}

// Step `step`'s x slice of the tile's rows (zeros past `rows`): each row's pieces 0 and 2 in four
// 16-byte copies, 1 and 3 in eight 8-byte ones. `any` is a valid address for the zero copies.
__device__ __forceinline__ void load_x(float* to, const float* x_rows, int64_t ldx, int rows, int step,
                                       const float* any, int tid) {
  constexpr int kCopiesPerRow = 24;
  for (int i = tid; i < kRows * kCopiesPerRow; i += kThreads) {
    const int r = i / kCopiesPerRow, c = i % kCopiesPerRow, piece = c < 4 ? 0 : c < 12 ? 1 : c < 16 ? 2 : 3;
    const bool wide = piece % 2 == 0, valid = r < rows;
    const int within = wide ? 4 * (c - (piece == 0 ? 0 : 12)) : 2 * (c - (piece == 1 ? 4 : 16));
    float* dst = to + r * kXPitch + x_piece(piece) + within;
    const float* src = valid ? x_rows + int64_t(r) * ldx + step * kStep + 16 * piece + within : any;
    wide ? copy_16(dst, src, valid) : copy_8(dst, src, valid);
  }
}

// Raw stage `stage` of the block's weight rows (none for rows past n).
template <GgmlType T>
__device__ __forceinline__ void load_raw(uint8_t* to, const uint8_t* const* row_at, int stage, int tid) {
  using R = Raw<T>;
  for (int i = tid; i < kCols * R::kPieces; i += kThreads) {
    const int r = i / R::kPieces, piece = i % R::kPieces;
    if (!row_at[r]) continue;
    const uint8_t* begin = row_at[r] + size_t(stage) * R::kBytes;
    if (R::kBytes % 16 == 0 && begin != line_start(begin)) __trap();  // no room for a misaligned stage
    const uint8_t* from = line_start(begin) + 16 * piece;
    if (from < begin + R::kBytes) copy_16(to + r * R::kPitchBytes + 16 * piece, from, true);
  }
}

// Lane (g, t) of warp w's A fragments for step s: weight rows 32 w + 16 mt + 8 h + g (m-tile mt,
// half h), values [16 t, 16 t + 16) of the step, as tf32; zeros for rows past n.
template <GgmlType T>
__device__ __forceinline__ void weight_fragments(const uint8_t* raw, const uint8_t* const* row_at, int s, int warp,
                                                 int g, int t, uint32_t (&a)[2][2][16]) {
  using R = Raw<T>;
  const int stage = s / R::kSteps;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 32 * warp + 16 * mt + 8 * h + g;
      float v[16];
      if (const uint8_t* row = row_at[r]) {
        const uint8_t* begin = row + size_t(stage) * R::kBytes;
        Sixteen<T>::values(raw + (size_t(stage % 2) * kCols + r) * R::kPitchBytes + (begin - line_start(begin)),
                           (s % R::kSteps) * kStep + 16 * t, v);
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < 16; ++i) a[mt][h][i] = to_tf32(v[i]);
    }
}

// One step's products: substeps outermost, so that sixteen independent sums separate two updates
// of one. x_step: this lane's x row g, piece t, of the step's slice.
__device__ __forceinline__ void step_products(const float* x_step, const uint32_t (&a)[2][2][16],
                                              float (&acc)[2][8][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float2 two = *reinterpret_cast<const float2*>(x_step + 8 * nt * kXPitch + 2 * j);
      const uint32_t b[2] = {__float_as_uint(two.x), __float_as_uint(two.y)};
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint32_t frag[4] = {a[mt][0][2 * j], a[mt][1][2 * j], a[mt][0][2 * j + 1], a[mt][1][2 * j + 1]};
        mma_tf32(acc[mt][nt], frag, b);
      }
    }
}

// Lane (g, t)'s sums of a warp's tile into y (rows ldy floats apart): weight row (output column)
// col0 + 16 mt + 8 (c / 2) + g, x row first_row + 8 nt + 2 t + c % 2; none past column n or past
// `rows` rows.
template <int kXTiles>
__device__ __forceinline__ void store_sums(const float (&acc)[2][kXTiles][4], float* y, int64_t ldy, int first_row,
                                           int col0, int g, int t, int n, int rows) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < kXTiles; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int col = col0 + 16 * mt + 8 * (c / 2) + g, row = 8 * nt + 2 * t + c % 2;
        if (col < n && row < rows) y[int64_t(first_row + row) * ldy + col] = acc[mt][nt][c];
      }
}

// The units' kernel: blocks of z = 0 and 1 take a tile's first and second kRows x rows.
template <GgmlType T>
__global__ void __launch_bounds__(kThreads, 3)
    expert_products_kernel(const ExpertTile* tiles, const void* const* table, int parts, int part_rows, int n,
                           int cols, size_t row_bytes, const float* x, int64_t ldx, float* y, int64_t ldy) {
  using R = Raw<T>;
  extern __shared__ float4 shared4[];
  float* const xs = reinterpret_cast<float*>(shared4);                      // [2][kRows][kXPitch]
  uint8_t* const raw = reinterpret_cast<uint8_t*>(xs + 2 * kRows * kXPitch);  // [2][kCols][R::kPitchBytes]
  __shared__ const uint8_t* row_at[kCols];  // each output column's weight row (null past n)
  const ExpertTile tile = tiles[blockIdx.x];
  if (tile.rows > kTileRows) __trap();  // the tiles are cut at kExpertTileRows
  const int first = kRows * int(blockIdx.z);
  if (first >= tile.rows) return;
  const int rows = min(kRows, tile.rows - first);
  const int col0 = int(blockIdx.y) * kCols, tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  for (int r = tid; r < kCols; r += kThreads) {
    const int col = col0 + r;
    row_at[r] = col < n ? static_cast<const uint8_t*>(table[int64_t(tile.matrix) * parts + col / part_rows]) +
                              int64_t(col % part_rows) * row_bytes
                        : nullptr;
  }
  __syncthreads();
  const float* x_rows = x + int64_t(tile.first_row + first) * ldx;
  const auto x_slice = [&](int step) { return xs + (step % 2) * kRows * kXPitch; };
  const auto raw_stage = [&](int stage) { return raw + size_t(stage % 2) * kCols * R::kPitchBytes; };

  const int g = lane / 4, t = lane % 4;
  float acc[2][8][4] = {};
  const int steps = cols / kStep;
  load_raw<T>(raw_stage(0), row_at, 0, tid);
  load_x(x_slice(0), x_rows, ldx, rows, 0, x, tid);
  copies_sent();
  for (int s = 0; s < steps; ++s) {
    copies_arrived();
    __syncthreads();  // step s's bytes are in; every warp is done with step s - 1
    if (s + 1 < steps) {
      load_x(x_slice(s + 1), x_rows, ldx, rows, s + 1, x, tid);
      if ((s + 1) % R::kSteps == 0) load_raw<T>(raw_stage((s + 1) / R::kSteps), row_at, (s + 1) / R::kSteps, tid);
      copies_sent();
    }
    uint32_t a[2][2][16];
    weight_fragments<T>(raw, row_at, s, warp, g, t, a);
    step_products(x_slice(s) + g * kXPitch + x_piece(t), a, acc);
  }

  store_sums(acc, y, ldy, tile.first_row + first, col0 + 32 * warp, g, t, n, rows);
}

// The codes kernel. A step stages, per weight row, the pieces of it that the step reads. For
// Q4_K/Q5_K: the block's 16-byte head (d, dmin, the 12 scale bytes), Q5_K's 32 bytes of high bits,
// and the step's 32 code bytes. For Q8_0: the 16-byte lines that hold the step's two blocks (68
// bytes; rows start on 4-byte boundaries, so the step starts 0, 4, 8 or 12 bytes into its first
// line, and five lines hold it). An odd number of 16-byte pieces, so that the rows' loads spread
// over the banks.
template <GgmlType T>
struct KQuant;
template <>
struct KQuant<GgmlType::Q4_K> {
  static constexpr size_t kBlockBytes = sizeof(quant::BlockQ4_K);
  static constexpr int kHighPieces = 0;
};
template <>
struct KQuant<GgmlType::Q5_K> {
  static constexpr size_t kBlockBytes = sizeof(quant::BlockQ5_K);
  static constexpr int kHighPieces = 2;
};
template <GgmlType T>
constexpr bool kHasCodesKernel = T == GgmlType::Q4_K || T == GgmlType::Q5_K || T == GgmlType::Q8_0;

template <GgmlType T>
struct StepStage {
  using K = KQuant<T>;
  static constexpr int kCodesPiece = 1 + K::kHighPieces;
  static constexpr int kPieces = kCodesPiece + 2;
  static constexpr size_t kPitchBytes = size_t(kPieces) * 16;
  static constexpr int kRowAlign = 16;  // the pieces are copied from where they lie
  static_assert(kPieces % 2 == 1 && kStep * 4 == 256);
  // Piece p of step s of `row`: the head and high bits of block s / 4, then the codes of its values
  // [64 (s % 4), 64 (s % 4) + 64), which share 32 bytes (low and high nibbles).
  __device__ static const uint8_t* piece(const uint8_t* row, int s, int p) {
    const size_t block = size_t(s / 4) * K::kBlockBytes;
    return row + (p < kCodesPiece ? block + 16 * p : block + 16 * kCodesPiece + 32 * (s % 4) + 16 * (p - kCodesPiece));
  }
};
template <>
struct StepStage<GgmlType::Q8_0> {
  static constexpr size_t kStepBytes = 2 * sizeof(quant::BlockQ8_0);
  static constexpr int kPieces = 5;
  static constexpr size_t kPitchBytes = size_t(kPieces) * 16;
  static constexpr int kRowAlign = 4;
  static_assert(kStepBytes == 68 && kStep == 64);
  __device__ static const uint8_t* piece(const uint8_t* row, int s, int p) {
    return line_start(row + kStepBytes * size_t(s)) + 16 * p;
  }
};

// A lane's share of one weight row in one step: values [16 t, 16 t + 16), all of sub-block
// 2 (s % 4) + t / 2, as codes (shifted to their nibble and high bit) and the sub-block's d * scale
// and dmin * min. value(i) is what the unit expands (d * scale * q - dmin * min), as tf32.
// `row_skew`: where the row starts within its 16-byte line (Q8_0's steps are not whole lines).
template <GgmlType T>
struct RowCodes {
  uint32_t codes[4], high[4];
  float d, m;

  __device__ __forceinline__ void read(const uint8_t* row, int s, int t, int /*row_skew*/) {
    using S = StepStage<T>;
    const int sub = 2 * (s % 4) + t / 2;
    const uint32_t head = *reinterpret_cast<const uint32_t*>(row);
    const uint32_t words[3] = {*reinterpret_cast<const uint32_t*>(row + 4),
                               *reinterpret_cast<const uint32_t*>(row + 8),
                               *reinterpret_cast<const uint32_t*>(row + 12)};
    float scale, min;
    k4_scale_min(words, sub, &scale, &min);
    d = __half2float(__ushort_as_half(uint16_t(head & 0xffff))) * scale;
    m = __half2float(__ushort_as_half(uint16_t(head >> 16))) * min;
    const uint4 c = *reinterpret_cast<const uint4*>(row + 16 * S::kCodesPiece + 16 * (t % 2));
    const int shift = 4 * (t / 2);
    codes[0] = c.x >> shift, codes[1] = c.y >> shift, codes[2] = c.z >> shift, codes[3] = c.w >> shift;
    if constexpr (KQuant<T>::kHighPieces > 0) {
      const uint4 h = *reinterpret_cast<const uint4*>(row + 16 + 16 * (t % 2));
      high[0] = h.x >> sub, high[1] = h.y >> sub, high[2] = h.z >> sub, high[3] = h.w >> sub;
    }
  }
  __device__ __forceinline__ uint32_t value(int i) const {
    int q = int((codes[i / 4] >> (8 * (i % 4))) & 15);
    if constexpr (KQuant<T>::kHighPieces > 0) q |= int((high[i / 4] >> (8 * (i % 4))) & 1) << 4;
    return to_tf32(d * float(q) - m);
  }
};

// Q8_0: the lane's 16 values are half of block t / 2 of the step, d * q as Expand<Q8_0> gives them.
// The codes of block 0 start 2 bytes past a word (the step starts on a word, its d first), those
// of block 1 on a word: block 0's lanes read five words and shift them by 16 bits.
template <>
struct RowCodes<GgmlType::Q8_0> {
  uint32_t codes[4];
  float d;

  __device__ __forceinline__ void read(const uint8_t* row, int s, int t, int row_skew) {
    const uint8_t* block = row + (row_skew + 4 * (s % 4)) % 16 + 34 * (t / 2);  // (68 s = 4 s mod 16)
    d = __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(block)));
    const uint32_t* words = reinterpret_cast<const uint32_t*>(block + 16 * (t % 2) + (t < 2 ? 0 : 2));
    const uint32_t w[5] = {words[0], words[1], words[2], words[3], t < 2 ? words[4] : 0u};
#pragma unroll
    for (int i = 0; i < 4; ++i) codes[i] = __funnelshift_r(w[i], w[i + 1], t < 2 ? 16 : 0);
  }
  __device__ __forceinline__ uint32_t value(int i) const {
    return to_tf32(d * float(int(int8_t(uint8_t(codes[i / 4] >> (8 * (i % 4)))))));
  }
};

// The codes kernel for tiles of at most kXRows x rows, with the bytes of kStages - 1 steps in
// flight while a step computes. Each copy instruction of a warp reads consecutive bytes: lane l
// copies values [2 l, 2 l + 2) of one x row's step (one row's 256 bytes, two cache lines), and
// consecutive lanes take consecutive pieces of the weight rows. (A thread per row made each
// instruction touch 32 lines.) Rows past n or past the tile's are not staged: the tensor cores'
// rows and columns are independent sums, and those sums are never stored; x rows past the tile's
// are skipped in the products (KQuantForm::kSkipRows at a time). Tiles of take_above rows or
// fewer, and with larger_elsewhere those of more than kXRows, are another launch's. Every form
// runs each sum through the same steps, substeps and mma instructions in the same order, so a row
// gets the same bits from each (ExpertTileForms).
template <GgmlType T, int kXRows, int kStages>
struct KQuantForm {
  using S = StepStage<T>;
  static_assert(kXRows % 32 == 0 && kXRows <= kTileRows && kStages >= 2);
  static constexpr int kXTiles = kXRows / 8;
  // x rows past the tile's are skipped this many at a time: the small form's 8 (an mma's), the
  // large form's 32 (with a check every 8 rows, bench_cuda_matvec's 2,048 tokens' gate|up took
  // 986 us on an H100 against 749).
  static constexpr int kSkipRows = kXRows <= 32 ? 8 : 32;
  static constexpr size_t kXStage = size_t(kXRows) * kXPitch * sizeof(float);
  static constexpr size_t kWStage = size_t(kCols) * S::kPitchBytes;
  static constexpr size_t kShared = kStages * (kXStage + kWStage);
};

template <GgmlType T, int kXRows, int kStages, int kBlocksPerSm>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    kquant_expert_products_kernel(const ExpertTile* tiles, const void* const* table, int parts, int part_rows, int n,
                                  int cols, size_t row_bytes, const float* x, int64_t ldx, float* y, int64_t ldy,
                                  int take_above, bool larger_elsewhere) {
  using S = StepStage<T>;
  using F = KQuantForm<T, kXRows, kStages>;
  static_assert(kThreads == kCols);
  extern __shared__ float4 shared4[];
  uint8_t* const stages = reinterpret_cast<uint8_t*>(shared4);  // stage i: x [kXRows][kXPitch], then weights
  __shared__ const uint8_t* row_at[kCols];  // each output column's weight row (null past n)
  const ExpertTile tile = tiles[blockIdx.x];
  if (tile.rows <= take_above) return;  // a smaller form's launch takes it
  if (tile.rows > kXRows) {
    if (larger_elsewhere) return;
    __trap();  // no launch for it: the caller's TileRows were wrong
  }
  const int col0 = int(blockIdx.y) * kCols, tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  {
    const int col = col0 + tid;
    const uint8_t* const row =
        col < n ? static_cast<const uint8_t*>(table[int64_t(tile.matrix) * parts + col / part_rows]) +
                      int64_t(col % part_rows) * row_bytes
                : nullptr;
    if (row && reinterpret_cast<uintptr_t>(row) % S::kRowAlign != 0) __trap();  // expert_products_aligned says no
    row_at[tid] = row;
  }
  __syncthreads();
  const int g = lane / 4, t = lane % 4;
  int row_skew[2][2];  // where this lane's weight rows start in their 16-byte lines
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      row_skew[mt][h] = int(reinterpret_cast<uintptr_t>(row_at[32 * warp + 16 * mt + 8 * h + g]) % 16);
  const auto stage_at = [&](int s) { return stages + (s % kStages) * (F::kXStage + F::kWStage); };
  const auto x_stage = [&](int s) { return reinterpret_cast<float*>(stage_at(s)); };
  const auto w_stage = [&](int s) { return stage_at(s) + F::kXStage; };
  const float* const x_lane = x + int64_t(tile.first_row) * ldx + 2 * lane;
  const int x_at = x_piece(lane / 8) + 2 * (lane % 8);
  const int steps = cols / kStep;
  // Step s's bytes, as one group of copies (none past the last step: the group stays, empty, so
  // that the groups still count the steps).
  const auto stage = [&](int s) {
    if (s < steps) {
      float* const x_to = x_stage(s) + x_at;
      for (int r = warp; r < tile.rows; r += kThreads / 32)
        copy_8(x_to + r * kXPitch, x_lane + int64_t(r) * ldx + s * kStep, true);
      uint8_t* const w_to = w_stage(s);
#pragma unroll
      for (int i = tid; i < kCols * S::kPieces; i += kThreads) {
        const int r = i / S::kPieces, p = i % S::kPieces;
        if (row_at[r]) copy_16(w_to + r * S::kPitchBytes + 16 * p, S::piece(row_at[r], s, p), true);
      }
    }
    copies_sent();
  };

  float acc[2][F::kXTiles][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) stage(s);
  for (int s = 0; s < steps; ++s) {
    copies_arrived_but<kStages - 2>();
    __syncthreads();  // step s's bytes are in; every warp is done with step s - 1, whose room the next stage takes
    stage(s + kStages - 1);
    RowCodes<T> w[2][2];  // weight rows 32 w + 16 mt + 8 h + g
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        w[mt][h].read(w_stage(s) + (32 * warp + 16 * mt + 8 * h + g) * S::kPitchBytes, s, t, row_skew[mt][h]);
    const float* const x_step = x_stage(s) + g * kXPitch + x_piece(t);
    // Substeps outermost, so that the independent sums separate two updates of one.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        a[mt][0] = w[mt][0].value(2 * j), a[mt][1] = w[mt][1].value(2 * j);
        a[mt][2] = w[mt][0].value(2 * j + 1), a[mt][3] = w[mt][1].value(2 * j + 1);
      }
#pragma unroll
      for (int nt = 0; nt < F::kXTiles; ++nt) {
        if (nt % (F::kSkipRows / 8) == 0 && 8 * nt >= tile.rows) break;
        const float2 two = *reinterpret_cast<const float2*>(x_step + 8 * nt * kXPitch + 2 * j);
        const uint32_t b[2] = {__float_as_uint(two.x), __float_as_uint(two.y)};
        mma_tf32(acc[0][nt], a[0], b);
        mma_tf32(acc[1][nt], a[1], b);
      }
    }
  }

  store_sums(acc, y, ldy, tile.first_row, col0 + 32 * warp, g, t, n, tile.rows);
}

// The codes kernel's forms: tiles of up to kSmallTileRows rows (a short prompt's experts get a few
// rows each) hold a quarter of the x rows in shared memory and a quarter of the sums in registers, so
// a multiprocessor takes twice the blocks, each with two steps of weights in flight; every weight
// is still expanded once a tile, but more blocks' copies and expansion overlap. On an H100,
// bench_cuda_matvec's 256 tokens' gate|up 347 us against 450 through the large form alone (then
// skipping rows 8 at a time), down 243 against 307. Measured and dropped: a form of 32 rows with three steps in flight (256 tokens'
// gate|up 375 us), one of 64 rows at three blocks a multiprocessor (720 tokens' gate|up 484 us
// against 515, their down 364 against 322).
constexpr int kSmallTileRows = 32;
template <GgmlType T>
using SmallForm = KQuantForm<T, kSmallTileRows, 3>;
template <GgmlType T>
using LargeForm = KQuantForm<T, kTileRows, 2>;
template <GgmlType T>
constexpr auto kSmallKernel = kquant_expert_products_kernel<T, kSmallTileRows, 3, 4>;
template <GgmlType T>
constexpr auto kLargeKernel = kquant_expert_products_kernel<T, kTileRows, 2, 2>;

// Launches `kernel` over every tile and column block (passes: blocks a tile and column block).
template <class Kernel, class... Args>
cudaError_t launch_tiles(Kernel kernel, size_t shared, int64_t n_tiles, int64_t n, int passes, void* stream,
                         Args... args) {
  if (const cudaError_t err = kernels::allow_shared(kernel, shared)) return err;
  const dim3 grid(unsigned(n_tiles), blocks_for(n, kCols), unsigned(passes));
  kernel<<<grid, kThreads, shared, as_stream(stream)>>>(args...);
  return cudaGetLastError();
}

}  // namespace

size_t expert_products_shared_bytes(GgmlType type) {
  size_t bytes = 0;
  for_weight_type<WeightKernel::expand>(type, [&](auto t) {
    constexpr GgmlType T = decltype(t)::value;
    if constexpr (kHasCodesKernel<T>)
      bytes = std::max(SmallForm<T>::kShared, LargeForm<T>::kShared);
    else
      bytes = Raw<T>::kShared;
    bytes += kCols * sizeof(void*);  // both kernels' row_at
  });
  return bytes;
}

bool expert_products_aligned(GgmlType type, size_t offset, size_t row_bytes) {
  size_t align = 1;  // what the rows and the matrix's start must be multiples of
  for_weight_type<WeightKernel::expand>(type, [&](auto t) {
    constexpr GgmlType T = decltype(t)::value;
    if constexpr (kHasCodesKernel<T>)
      align = StepStage<T>::kRowAlign;
    else
      align = Raw<T>::kBytes % 16 == 0 ? 16 : 1;
  });
  return offset % align == 0 && row_bytes % align == 0;
}

bool has_expert_products(GgmlType type, int64_t cols) {
  return cols % kStep == 0 && read_by(type, WeightKernel::expand);
}

const char* expert_products(GgmlType type, const ExpertTile* tiles, int64_t n_tiles, TileRows rows,
                            const void* const* table, int64_t parts, int64_t part_rows, int64_t cols,
                            size_t row_bytes, const float* x, int64_t ldx, float* y, int64_t ldy, void* stream,
                            ExpertTileForms forms) {
  const int64_t n = parts * part_rows;
  if (!has_expert_products(type, cols)) return "no tensor-core expert product for this type and row length";
  if (ldx % 4 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return "expert products read x in 16-byte pieces: x on a 16-byte boundary, ldx a multiple of 4";
  if (n_tiles == 0 || n == 0) return nullptr;
  cudaError_t err = cudaSuccess;
  for_weight_type<WeightKernel::expand>(type, [&](auto t) {
    constexpr GgmlType T = decltype(t)::value;
    const auto args = [&](auto launch) {
      return launch(tiles, table, int(parts), int(part_rows), int(n), int(cols), row_bytes, x, ldx, y, ldy);
    };
    if constexpr (kHasCodesKernel<T>) {
      const bool small = forms == ExpertTileForms::small ||
                         (forms == ExpertTileForms::by_rows && rows.fewest <= kSmallTileRows);
      const bool large = forms == ExpertTileForms::large ||
                         (forms == ExpertTileForms::by_rows && rows.most > kSmallTileRows);
      if (small)
        err = args([&](auto... a) {
          return launch_tiles(kSmallKernel<T>, SmallForm<T>::kShared, n_tiles, n, 1, stream, a..., 0, large);
        });
      if (large && err == cudaSuccess)
        err = args([&](auto... a) {
          return launch_tiles(kLargeKernel<T>, LargeForm<T>::kShared, n_tiles, n, 1, stream, a...,
                              small ? kSmallTileRows : 0, false);
        });
    } else {
      err = args([&](auto... a) {
        return launch_tiles(expert_products_kernel<T>, Raw<T>::kShared, n_tiles, n, kTileRows / kRows, stream, a...);
      });
    }
  });
  return error_text(err);
}

}  // namespace lode::cuda
