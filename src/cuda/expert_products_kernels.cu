// The kernel behind cuda/expert_products.h. A block computes 128 weight rows (output columns) x a
// tile of 64 x rows, in steps of 64 values along the rows, as D = W X^T: the weights are the
// tensor cores' A operand, so each lane expands its own fragments in registers, and only x passes
// through shared memory as the B operand (mma.sync m16n8k8 tf32; four warps of 32 weight rows x 64
// x rows). A step's 64 values are taken in an order of our own: slot s of substep j is value
// 16 s + 2 j, slot s + 4 value 16 s + 2 j + 1 (the same for both operands, so the sum is the same
// dot product), which gives each lane 16 consecutive values of a weight row per step: one 16-byte
// load of a k-quant's codes. Substeps run outermost, so that sixteen independent sums separate two
// updates of one (the tensor cores' latency). The weights' stored bytes come into shared memory by
// cp.async, whole blocks at a time (a raw stage: a k-quant's 256 values, or one step), with x's next
// step. x comes rounded to tf32 (kernels::gather_rows, swiglu_rows).
#include <cuda_runtime.h>

#include "cuda/expand_units.cuh"
#include "cuda/expert_products.h"
#include "cuda/kernel_math.cuh"

namespace lode::cuda {

namespace {

using expand::Expand;
using kernels::as_stream;
using kernels::blocks_for;
using kernels::error_text;

constexpr int kRows = 64;       // x rows per tile
constexpr int kCols = 128;      // weight rows (output columns) per block: 32 per warp
constexpr int kStep = 64;       // values along the rows per step
constexpr int kThreads = 128;
// x in shared memory: a row's four 16-value pieces at 18 s, rows 72 floats apart, so that the 8-byte
// loads of (row g, piece t, values 2 j and 2 j + 1) by each half warp hit 32 different banks. Pieces
// 0 and 2 arrive in 16-byte copies, 1 and 3 (8-byte aligned) in 8-byte ones.
constexpr int kXPitch = 72;
__host__ __device__ constexpr int x_piece(int s) { return 18 * s; }
static_assert(kRows == kExpertTileRows);

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

// Values [v0, v0 + 16) of a raw stage's row (v0 a multiple of 16): any type through its unit (the
// unit's other half computed and dropped); the k-quants of the common recipes from their codes.
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

// Q4_K (qh_at 0) or Q5_K: d * scale * q - dmin * min, as the unit expands it.
template <size_t kBlockBytes, int kQhAt, int kQsAt>
__device__ __forceinline__ void k4_sixteen(const uint8_t* stage, int v0, float* v) {
  const uint8_t* block = stage + size_t(v0 / 256) * kBlockBytes;
  const int sub = (v0 % 256) / 32, half = (v0 % 32) / 16;
  const uint32_t head = *reinterpret_cast<const uint32_t*>(block);
  const uint32_t words[3] = {*reinterpret_cast<const uint32_t*>(block + 4),
                             *reinterpret_cast<const uint32_t*>(block + 8),
                             *reinterpret_cast<const uint32_t*>(block + 12)};
  float scale, min;
  k4_scale_min(words, sub, &scale, &min);
  const float d = __half2float(__ushort_as_half(uint16_t(head & 0xffff))) * scale;
  const float m = __half2float(__ushort_as_half(uint16_t(head >> 16))) * min;
  const uint4 codes = *reinterpret_cast<const uint4*>(block + kQsAt + 32 * (sub / 2) + 16 * half);
  const uint32_t c[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t h[4] = {0, 0, 0, 0};
  if constexpr (kQhAt > 0) {
    const uint4 high = *reinterpret_cast<const uint4*>(block + kQhAt + 16 * half);
    h[0] = high.x, h[1] = high.y, h[2] = high.z, h[3] = high.w;
  }
  const int shift = 4 * (sub % 2);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    int value = int((c[i / 4] >> (8 * (i % 4) + shift)) & 15);
    if constexpr (kQhAt > 0) value |= int((h[i / 4] >> (8 * (i % 4) + sub)) & 1) << 4;
    v[i] = d * float(value) - m;
  }
}

template <>
struct Sixteen<GgmlType::Q4_K> {
  __device__ static void values(const uint8_t* stage, int v0, float* v) {
    k4_sixteen<sizeof(quant::BlockQ4_K), 0, 16>(stage, v0, v);
  }
};
template <>
struct Sixteen<GgmlType::Q5_K> {
  __device__ static void values(const uint8_t* stage, int v0, float* v) {
    k4_sixteen<sizeof(quant::BlockQ5_K), 16, 48>(stage, v0, v);
  }
};

__device__ __forceinline__ uint32_t to_tf32(float v) { return __float_as_uint(kernels::tf32_rounded(v)); }

// c += a b for one m16n8k8 tile (the PTX ISA's fragment layouts).
__device__ __forceinline__ void mma_tf32(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// 16 bytes from global to shared memory without passing through registers; zeros where !valid.
__device__ __forceinline__ void copy_16(void* shared, const void* global, bool valid) {
  const unsigned at = unsigned(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(global), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy_8(void* shared, const void* global, bool valid) {
  const unsigned at = unsigned(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(at), "l"(global), "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void copies_sent() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void copies_arrived() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

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
  const int col0 = int(blockIdx.y) * kCols, tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  for (int r = tid; r < kCols; r += kThreads) {
    const int col = col0 + r;
    row_at[r] = col < n ? static_cast<const uint8_t*>(table[int64_t(tile.matrix) * parts + col / part_rows]) +
                              int64_t(col % part_rows) * row_bytes
                        : nullptr;
  }
  __syncthreads();
  const float* x_rows = x + int64_t(tile.first_row) * ldx;
  const auto x_slice = [&](int step) { return xs + (step % 2) * kRows * kXPitch; };
  const auto raw_stage = [&](int stage) { return raw + size_t(stage % 2) * kCols * R::kPitchBytes; };

  const int g = lane / 4, t = lane % 4;
  float acc[2][8][4] = {};
  const int steps = cols / kStep;
  load_raw<T>(raw_stage(0), row_at, 0, tid);
  load_x(x_slice(0), x_rows, ldx, tile.rows, 0, x, tid);
  copies_sent();
  for (int s = 0; s < steps; ++s) {
    copies_arrived();
    __syncthreads();  // step s's bytes are in; every warp is done with step s - 1
    if (s + 1 < steps) {
      load_x(x_slice(s + 1), x_rows, ldx, tile.rows, s + 1, x, tid);
      if ((s + 1) % R::kSteps == 0) load_raw<T>(raw_stage((s + 1) / R::kSteps), row_at, (s + 1) / R::kSteps, tid);
      copies_sent();
    }
    uint32_t a[2][2][16];
    weight_fragments<T>(raw, row_at, s, warp, g, t, a);
    step_products(x_slice(s) + g * kXPitch + x_piece(t), a, acc);
  }

  // Lane (g, t)'s sums: weight row (output column) 32 w + 16 mt + 8 (c / 2) + g, x row 8 nt + 2 t + c % 2.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int col = col0 + 32 * warp + 16 * mt + 8 * (c / 2) + g, row = 8 * nt + 2 * t + c % 2;
        if (col < n && row < tile.rows) y[int64_t(tile.first_row + row) * ldy + col] = acc[mt][nt][c];
      }
}

}  // namespace

size_t expert_products_shared_bytes(GgmlType type) {
  size_t bytes = 0;
  for_weight_type<WeightKernel::expand>(type, [&](auto t) { bytes = Raw<decltype(t)::value>::kShared + kCols * sizeof(void*); });
  return bytes;
}

bool expert_products_aligned(GgmlType type, size_t offset, size_t row_bytes) {
  bool whole_pieces = false;
  for_weight_type<WeightKernel::expand>(type, [&](auto t) { whole_pieces = Raw<decltype(t)::value>::kBytes % 16 == 0; });
  return !whole_pieces || (offset % 16 == 0 && row_bytes % 16 == 0);
}

bool has_expert_products(GgmlType type, int64_t cols) {
  return cols % kStep == 0 && read_by(type, WeightKernel::expand);
}

const char* expert_products(GgmlType type, const ExpertTile* tiles, int64_t n_tiles, const void* const* table,
                            int64_t parts, int64_t part_rows, int64_t cols, size_t row_bytes, const float* x,
                            int64_t ldx, float* y, int64_t ldy, void* stream) {
  const int64_t n = parts * part_rows;
  if (!has_expert_products(type, cols)) return "no tensor-core expert product for this type and row length";
  if (ldx % 4 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return "expert products read x in 16-byte pieces: x on a 16-byte boundary, ldx a multiple of 4";
  if (n_tiles == 0 || n == 0) return nullptr;
  const dim3 grid(unsigned(n_tiles), blocks_for(n, kCols));
  cudaError_t err = cudaSuccess;
  for_weight_type<WeightKernel::expand>(type, [&](auto t) {
    const auto kernel = expert_products_kernel<decltype(t)::value>;
    constexpr size_t shared = Raw<decltype(t)::value>::kShared;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
    if (err != cudaSuccess) return;
    kernel<<<grid, kThreads, shared, as_stream(stream)>>>(tiles, table, int(parts), int(part_rows), int(n),
                                                               int(cols), row_bytes, x, ldx, y, ldy);
    err = cudaGetLastError();
  });
  return error_text(err);
}

}  // namespace lode::cuda
