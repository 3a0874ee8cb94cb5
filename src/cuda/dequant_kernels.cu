// The kernels behind cuda/dequant.h: one thread expands one 32-value unit of a row (a Q8_0/Q4_0/
// Q5_0/IQ4_NL/MXFP4 block, a Q4_K/Q5_K/IQ4_XS sub-block, a quarter of a Q6_K half, or 32 plain
// values) into 32 floats, written as eight 16-byte stores.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "core/quant/blocks.h"
#include "cuda/dequant.h"

namespace lode::cuda {

namespace {

using namespace lode::quant;

__device__ __forceinline__ float half_value(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

__constant__ int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
__constant__ int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

template <GgmlType T>
struct Expand;

template <>
struct Expand<GgmlType::F32> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const float* w = reinterpret_cast<const float*>(row) + 32 * u;
    for (int j = 0; j < 32; ++j) v[j] = w[j];
  }
};

template <>
struct Expand<GgmlType::F16> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row) + 32 * u;
    for (int j = 0; j < 32; ++j) v[j] = half_value(w[j]);
  }
};

template <>
struct Expand<GgmlType::BF16> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row) + 32 * u;
    for (int j = 0; j < 32; ++j) v[j] = __uint_as_float(uint32_t(w[j]) << 16);
  }
};

template <>
struct Expand<GgmlType::Q8_0> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[u];
    const float d = half_value(b.d);
    for (int j = 0; j < 32; ++j) v[j] = d * float(b.qs[j]);
  }
};

template <>
struct Expand<GgmlType::Q4_0> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockQ4_0& b = reinterpret_cast<const BlockQ4_0*>(row)[u];
    const float d = half_value(b.d);
    for (int j = 0; j < 16; ++j) {
      v[j] = d * float(int(b.qs[j] & 15) - 8);
      v[j + 16] = d * float(int(b.qs[j] >> 4) - 8);
    }
  }
};

template <>
struct Expand<GgmlType::Q5_0> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockQ5_0& b = reinterpret_cast<const BlockQ5_0*>(row)[u];
    const float d = half_value(b.d);
    const uint32_t qh = uint32_t(b.qh[0]) | uint32_t(b.qh[1]) << 8 | uint32_t(b.qh[2]) << 16 | uint32_t(b.qh[3]) << 24;
    for (int j = 0; j < 16; ++j) {
      v[j] = d * float(int((b.qs[j] & 15) | ((qh >> j) & 1) << 4) - 16);
      v[j + 16] = d * float(int((b.qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
    }
  }
};

// byte j of a 16-byte group: value j (low nibble) and value j + 16 (high), as table indices.
__device__ __forceinline__ void table_group(const uint8_t* q, const int8_t* table, float d, float* v) {
  for (int j = 0; j < 16; ++j) {
    v[j] = d * float(table[q[j] & 15]);
    v[j + 16] = d * float(table[q[j] >> 4]);
  }
}

template <>
struct Expand<GgmlType::IQ4_NL> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockIQ4_NL& b = reinterpret_cast<const BlockIQ4_NL*>(row)[u];
    table_group(b.qs, kIq4Values, half_value(b.d), v);
  }
};

template <>
struct Expand<GgmlType::IQ4_XS> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockIQ4_XS& b = reinterpret_cast<const BlockIQ4_XS*>(row)[u / 8];
    const int ib = int(u % 8);
    const int multiplier = (((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((b.scales_h >> (2 * ib)) & 3) << 4)) - 32;
    table_group(b.qs + 16 * ib, kIq4Values, half_value(b.d) * float(multiplier), v);
  }
};

template <>
struct Expand<GgmlType::MXFP4> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockMXFP4& b = reinterpret_cast<const BlockMXFP4*>(row)[u];
    // 2^(e - 128): the table is doubled; subnormal for e < 2.
    const float scale = __uint_as_float(b.e < 2 ? 0x00200000u << b.e : uint32_t(b.e - 1) << 23);
    table_group(b.qs, kMxfp4Values, scale, v);
  }
};

// Q4_K / Q5_K sub-block j's 6-bit scale and min (the packing of kquants_scales.h).
__device__ __forceinline__ void scale_min_k4(const uint8_t* packed, int j, float* scale, float* min) {
  if (j < 4) {
    *scale = float(packed[j] & 63);
    *min = float(packed[j + 4] & 63);
  } else {
    *scale = float((packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4));
    *min = float((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
  }
}

// Sub-block `sub` of a Q4_K (qh null) or Q5_K block: d * scale * q - dmin * min.
__device__ __forceinline__ void k4_sub_block(uint16_t d_bits, uint16_t dmin_bits, const uint8_t* scales,
                                             const uint8_t* qs, const uint8_t* qh, int sub, float* v) {
  float scale, min;
  scale_min_k4(scales, sub, &scale, &min);
  const float d = half_value(d_bits) * scale, m = half_value(dmin_bits) * min;
  const uint8_t* q = qs + 32 * (sub / 2);
  const int shift = 4 * (sub % 2);
  for (int j = 0; j < 32; ++j) {
    int value = (q[j] >> shift) & 15;
    if (qh) value |= ((qh[j] >> sub) & 1) << 4;
    v[j] = d * float(value) - m;
  }
}

template <>
struct Expand<GgmlType::Q4_K> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockQ4_K& b = reinterpret_cast<const BlockQ4_K*>(row)[u / 8];
    k4_sub_block(b.d, b.dmin, b.scales, b.qs, nullptr, int(u % 8), v);
  }
};

template <>
struct Expand<GgmlType::Q5_K> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockQ5_K& b = reinterpret_cast<const BlockQ5_K*>(row)[u / 8];
    k4_sub_block(b.d, b.dmin, b.scales, b.qs, b.qh, int(u % 8), v);
  }
};

template <>
struct Expand<GgmlType::Q6_K> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[u / 8];
    const int unit = int(u % 8), half = unit / 4, quarter = unit % 4;
    const uint8_t* low = b.ql + 64 * half + 32 * (quarter % 2);
    const uint8_t* qh = b.qh + 32 * half;
    const int low_shift = 4 * (quarter / 2), high_shift = 2 * quarter;
    const float d = half_value(b.d);
    const int sub = 8 * half + 2 * quarter;
    for (int j = 0; j < 32; ++j) {
      const int q = int(((low[j] >> low_shift) & 15) | (((qh[j] >> high_shift) & 3) << 4)) - 32;
      v[j] = d * float(b.scales[sub + j / 16]) * float(q);
    }
  }
};

constexpr int kThreads = 256;

// Each thread expands one unit into its warp's shared staging area; the warp's 32 units are
// contiguous in `out`, so the warp then writes them out as 16-byte stores that cover whole lines.
constexpr int kStagedUnit = 36;  // floats per unit in shared memory: 16-byte aligned, fewer bank conflicts

template <GgmlType T>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t* w, const void* const* table, const int32_t* ids, int64_t rows, int64_t units,
                      size_t row_bytes, int64_t total_units, float* out) {
  __shared__ float4 staged[kThreads * kStagedUnit / 4];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  float4* mine = staged + threadIdx.x * (kStagedUnit / 4);
  if (i < total_units) {
    const int64_t u = i % units, r = (i / units) % rows, m = i / (units * rows);
    const uint8_t* matrix = table ? static_cast<const uint8_t*>(table[ids ? ids[m] : m]) : w;
    float v[32];
    Expand<T>::unit(matrix + r * row_bytes, u, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) mine[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
  }
  __syncwarp();
  const int64_t warp_first = int64_t(blockIdx.x) * kThreads + warp * 32;
  const int64_t warp_units = min(int64_t(32), total_units - warp_first);
  if (warp_units <= 0) return;
  float4* o = reinterpret_cast<float4*>(out + warp_first * 32);
  const float4* from = staged + warp * 32 * (kStagedUnit / 4);
  for (int q = lane; q < warp_units * 8; q += 32) o[q] = from[(q / 8) * (kStagedUnit / 4) + q % 8];
}

template <GgmlType T>
cudaError_t launch(const void* w, const void* const* table, const int32_t* ids, int64_t n_matrices, int64_t rows,
                   int64_t cols, size_t row_bytes, float* out, cudaStream_t stream) {
  const int64_t units = cols / 32, total = n_matrices * rows * units;
  if (total == 0) return cudaSuccess;
  dequantize_kernel<T><<<unsigned((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(w), table, ids, rows, units, row_bytes, total, out);
  return cudaGetLastError();
}

}  // namespace

bool has_dequantize(GgmlType type) {
  switch (type) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::Q4_0:
    case GgmlType::Q5_0: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS: case GgmlType::MXFP4:
      return true;
    default:
      return false;
  }
}

const char* dequantize(GgmlType type, const void* w, const void* const* table, const int32_t* ids, int64_t n_matrices,
                       int64_t rows, int64_t cols, size_t row_bytes, float* out, void* stream) {
  if (cols % 32 != 0) return "rows must be a multiple of 32 values";
  const auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaErrorInvalidValue;
  switch (type) {
#define LODE_EXPAND_CASE(T) \
  case GgmlType::T: err = launch<GgmlType::T>(w, table, ids, n_matrices, rows, cols, row_bytes, out, s); break;
    LODE_EXPAND_CASE(F32) LODE_EXPAND_CASE(F16) LODE_EXPAND_CASE(BF16) LODE_EXPAND_CASE(Q8_0)
    LODE_EXPAND_CASE(Q4_0) LODE_EXPAND_CASE(Q5_0) LODE_EXPAND_CASE(Q4_K) LODE_EXPAND_CASE(Q5_K)
    LODE_EXPAND_CASE(Q6_K) LODE_EXPAND_CASE(IQ4_NL) LODE_EXPAND_CASE(IQ4_XS) LODE_EXPAND_CASE(MXFP4)
#undef LODE_EXPAND_CASE
    default: return "no dequantization kernel for this type";
  }
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace lode::cuda
