// The expansion units of the GPU's prompt products: Expand<T>::unit(row, u, v) writes the 32
// float values of unit u of a row of type T (a Q8_0/Q4_0/Q5_0/IQ4_NL/MXFP4 block, a Q4_K/Q5_K/IQ4_XS
// sub-block, a quarter of a Q6_K half, or 32 plain values), by lode's CPU dequantizers' formulas in
// their order. Shared by the expansion kernels (dequant_kernels.cu) and the experts' tensor-core
// products (expert_products_kernels.cu). Included by .cu files only.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "core/quant/blocks.h"
#include "core/quant/types.h"
#include "cuda/codebooks.cuh"
#include "cuda/weight_types.h"

namespace lode::cuda::expand {

using namespace lode::quant;

__device__ __forceinline__ float half_value(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

// Expand<T>::unit(row, u, v): the 32 values of unit u of `row` into v. kValues and kBytes: a
// block's values and bytes (32 plain values for float types); unit u lies in block u * 32 / kValues.
template <GgmlType T>
struct Expand;

template <class Block, int Values>
struct Blocks {
  static constexpr int kValues = Values;
  static constexpr size_t kBytes = sizeof(Block);
};

template <>
struct Expand<GgmlType::F32> : Blocks<float[32], 32> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const float* w = reinterpret_cast<const float*>(row) + 32 * u;
    for (int j = 0; j < 32; ++j) v[j] = w[j];
  }
};

template <>
struct Expand<GgmlType::F16> : Blocks<uint16_t[32], 32> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row) + 32 * u;
    for (int j = 0; j < 32; ++j) v[j] = half_value(w[j]);
  }
};

template <>
struct Expand<GgmlType::BF16> : Blocks<uint16_t[32], 32> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row) + 32 * u;
    for (int j = 0; j < 32; ++j) v[j] = __uint_as_float(uint32_t(w[j]) << 16);
  }
};

template <>
struct Expand<GgmlType::Q8_0> : Blocks<BlockQ8_0, 32> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[u];
    const float d = half_value(b.d);
    for (int j = 0; j < 32; ++j) v[j] = d * float(b.qs[j]);
  }
};

template <>
struct Expand<GgmlType::Q4_0> : Blocks<BlockQ4_0, 32> {
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
struct Expand<GgmlType::Q5_0> : Blocks<BlockQ5_0, 32> {
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
struct Expand<GgmlType::IQ4_NL> : Blocks<BlockIQ4_NL, 32> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockIQ4_NL& b = reinterpret_cast<const BlockIQ4_NL*>(row)[u];
    table_group(b.qs, kIq4Codebook.values, half_value(b.d), v);
  }
};

template <>
struct Expand<GgmlType::IQ4_XS> : Blocks<BlockIQ4_XS, 256> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockIQ4_XS& b = reinterpret_cast<const BlockIQ4_XS*>(row)[u / 8];
    const int ib = int(u % 8);
    const int multiplier = (((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((b.scales_h >> (2 * ib)) & 3) << 4)) - 32;
    table_group(b.qs + 16 * ib, kIq4Codebook.values, half_value(b.d) * float(multiplier), v);
  }
};

template <>
struct Expand<GgmlType::MXFP4> : Blocks<BlockMXFP4, 32> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockMXFP4& b = reinterpret_cast<const BlockMXFP4*>(row)[u];
    // 2^(e - 128): the table is doubled; subnormal for e < 2.
    const float scale = __uint_as_float(b.e < 2 ? 0x00200000u << b.e : uint32_t(b.e - 1) << 23);
    table_group(b.qs, kMxfp4Codebook.values, scale, v);
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
struct Expand<GgmlType::Q4_K> : Blocks<BlockQ4_K, 256> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockQ4_K& b = reinterpret_cast<const BlockQ4_K*>(row)[u / 8];
    k4_sub_block(b.d, b.dmin, b.scales, b.qs, nullptr, int(u % 8), v);
  }
};

template <>
struct Expand<GgmlType::Q5_K> : Blocks<BlockQ5_K, 256> {
  __device__ static void unit(const uint8_t* row, int64_t u, float* v) {
    const BlockQ5_K& b = reinterpret_cast<const BlockQ5_K*>(row)[u / 8];
    k4_sub_block(b.d, b.dmin, b.scales, b.qs, b.qh, int(u % 8), v);
  }
};

template <>
struct Expand<GgmlType::Q6_K> : Blocks<BlockQ6_K, 256> {
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

}  // namespace lode::cuda::expand
