// The kernels behind cuda/matvec.h. Each weight type says how to dot one 32-value unit of a row
// with x: a Q8_0/Q4_0/Q5_0/IQ4_NL/MXFP4 block, a Q4_K/Q5_K/IQ4_XS/grid i-quant sub-block, a
// quarter of a Q6_K half, or 32 plain values.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

#include "core/quant/blocks.h"
#include "cuda/codebooks.cuh"
#include "cuda/kernel_math.cuh"
#include "cuda/matvec_launch.h"
#include "cuda/weight_types.h"

namespace lode::cuda {

namespace {

using namespace lode::quant;

using kernels::input_value;
using kernels::kWarp;

__device__ __forceinline__ float half_bits(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

// Q4_K / Q5_K sub-block j's 6-bit scale and min (the 12-byte packing of kquants_scales.h).
__device__ __forceinline__ void scale_min_k4(const uint8_t* packed, int j, float* scale, float* min) {
  if (j < 4) {
    *scale = float(packed[j] & 63);
    *min = float(packed[j + 4] & 63);
  } else {
    *scale = float((packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4));
    *min = float((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
  }
}

// x of one problem sits in shared memory, 36 floats per 32-value unit: 16-byte aligned float4
// reads, and lanes reading the same offset of different units hit different banks.
constexpr int kUnitStride = 36;

__device__ __forceinline__ float dot4(float4 x, float a, float b, float c, float d) {
  return x.x * a + x.y * b + x.z * c + x.w * d;
}

// One 32-value unit of a row dotted with xs (its 32 x values in shared memory). Weight bytes are
// loaded 16 at a time where the block layout keeps them 16-byte aligned (K4/K5 nibbles, plain
// floats; rows must start 16-byte aligned), 2 at a time otherwise (Q8_0, Q4_0, Q6_K blocks have
// even sizes only).
template <GgmlType T>
struct Unit;

template <>
struct Unit<GgmlType::F32> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const float4* w = reinterpret_cast<const float4*>(row) + u * 8;
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 a = __ldg(w + k);
      s += dot4(xs[k], a.x, a.y, a.z, a.w);
    }
    return s;
  }
};

template <bool kBrain>
__device__ __forceinline__ float half_word_dot(uint4 v, const float4* xs) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    float f[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t word = words[2 * k + j / 2];
      const uint16_t bits = uint16_t(j % 2 ? word >> 16 : word & 0xffff);
      f[j] = kBrain ? __uint_as_float(uint32_t(bits) << 16) : half_bits(bits);
    }
    s += dot4(xs[k], f[0], f[1], f[2], f[3]);
  }
  return s;
}

// 32 fp16 (kBrain false) or bf16 values: four 16-byte loads.
template <bool kBrain>
struct HalfUnit {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const uint4* w = reinterpret_cast<const uint4*>(row) + u * 4;
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) s += half_word_dot<kBrain>(__ldg(w + k), xs + 2 * k);
    return s;
  }
};

template <>
struct Unit<GgmlType::F16> : HalfUnit<false> {};

template <>
struct Unit<GgmlType::BF16> : HalfUnit<true> {};

__device__ __forceinline__ float int8_pair(uint16_t v, int which) { return float(int8_t(which ? v >> 8 : v & 0xff)); }

template <>
struct Unit<GgmlType::Q8_0> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const uint8_t* block = row + u * sizeof(BlockQ8_0);
    const uint16_t* q = reinterpret_cast<const uint16_t*>(block + 2);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint16_t a = __ldg(q + 2 * k), b = __ldg(q + 2 * k + 1);
      s += dot4(xs[k], int8_pair(a, 0), int8_pair(a, 1), int8_pair(b, 0), int8_pair(b, 1));
    }
    return half_bits(__ldg(reinterpret_cast<const uint16_t*>(block))) * s;
  }
};

template <>
struct Unit<GgmlType::Q4_0> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const uint8_t* block = row + u * sizeof(BlockQ4_0);
    const uint16_t* q = reinterpret_cast<const uint16_t*>(block + 2);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // bytes 4k..4k+3: values 4k.. (low nibbles) and 16+4k.. (high)
      const uint16_t a = __ldg(q + 2 * k), b = __ldg(q + 2 * k + 1);
      s += dot4(xs[k], float(int(a & 15) - 8), float(int((a >> 8) & 15) - 8), float(int(b & 15) - 8),
                float(int((b >> 8) & 15) - 8));
      s += dot4(xs[4 + k], float(int((a >> 4) & 15) - 8), float(int(a >> 12) - 8), float(int((b >> 4) & 15) - 8),
                float(int(b >> 12) - 8));
    }
    return half_bits(__ldg(reinterpret_cast<const uint16_t*>(block))) * s;
  }
};

// Q5_0: Q4_0's nibbles (value j low, j + 16 high) plus a fifth bit per value, bit j of qh; minus 16.
template <>
struct Unit<GgmlType::Q5_0> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const uint8_t* block = row + u * sizeof(BlockQ5_0);
    const uint16_t* h16 = reinterpret_cast<const uint16_t*>(block + 2);
    const uint32_t qh = uint32_t(__ldg(h16)) | (uint32_t(__ldg(h16 + 1)) << 16);
    const uint16_t* q = reinterpret_cast<const uint16_t*>(block + 6);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t w = uint32_t(__ldg(q + 2 * k)) | (uint32_t(__ldg(q + 2 * k + 1)) << 16);
      float lo[4], hi[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * k + j;
        lo[j] = float(int(((w >> (8 * j)) & 15) | (((qh >> i) & 1) << 4)) - 16);
        hi[j] = float(int(((w >> (8 * j + 4)) & 15) | (((qh >> (i + 16)) & 1) << 4)) - 16);
      }
      s += dot4(xs[k], lo[0], lo[1], lo[2], lo[3]) + dot4(xs[4 + k], hi[0], hi[1], hi[2], hi[3]);
    }
    return half_bits(__ldg(reinterpret_cast<const uint16_t*>(block))) * s;
  }
};

// The lookup-table 4-bit formats (their value tables from codebooks.cuh): byte j of a 16-byte group
// holds value j (low nibble) and value j + 16 (high nibble) as table indices.

// byte(k) gives byte k of the group (0..15).
template <class Byte>
__device__ __forceinline__ float table_group_dot(Byte byte, const int8_t* table, const float4* xs) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint8_t b0 = byte(4 * k), b1 = byte(4 * k + 1), b2 = byte(4 * k + 2), b3 = byte(4 * k + 3);
    s += dot4(xs[k], table[b0 & 15], table[b1 & 15], table[b2 & 15], table[b3 & 15]);
    s += dot4(xs[4 + k], table[b0 >> 4], table[b1 >> 4], table[b2 >> 4], table[b3 >> 4]);
  }
  return s;
}

template <>
struct Unit<GgmlType::IQ4_NL> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const uint8_t* block = row + u * sizeof(BlockIQ4_NL);
    const uint16_t* q = reinterpret_cast<const uint16_t*>(block + 2);
    const float s = table_group_dot([&](int k) { return uint8_t(__ldg(q + k / 2) >> (8 * (k % 2))); }, kIq4Codebook.values, xs);
    return half_bits(__ldg(reinterpret_cast<const uint16_t*>(block))) * s;
  }
};

template <>
struct Unit<GgmlType::IQ4_XS> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const BlockIQ4_XS& b = reinterpret_cast<const BlockIQ4_XS*>(row)[u / 8];
    const int ib = int(u % 8);
    const int multiplier = (((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((b.scales_h >> (2 * ib)) & 3) << 4)) - 32;
    const uint16_t* q = reinterpret_cast<const uint16_t*>(b.qs + 16 * ib);
    const float s = table_group_dot([&](int k) { return uint8_t(__ldg(q + k / 2) >> (8 * (k % 2))); }, kIq4Codebook.values, xs);
    return (half_bits(b.d) * float(multiplier)) * s;
  }
};

template <>
struct Unit<GgmlType::MXFP4> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const uint8_t* block = row + u * sizeof(BlockMXFP4);  // 17-byte blocks: byte loads only
    const float s = table_group_dot([&](int k) { return __ldg(block + 1 + k); }, kMxfp4Codebook.values, xs);
    const uint8_t e = block[0];
    // 2^(e - 128): the table is doubled; subnormal for e < 2.
    const float scale = __uint_as_float(e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23);
    return scale * s;
  }
};

// The grid i-quants: codebooks in device memory, copied from lode's tables (core/quant/iq_grids.h)
// by upload_iq_grids before the first launch. Entry e holds value j in byte j.
__device__ uint64_t g_iq2xxs[256];
__device__ uint64_t g_iq2xs[512];
__device__ uint64_t g_iq2s[1024];
__device__ uint32_t g_iq3xxs[256];
__device__ uint32_t g_iq3s[512];
__device__ uint64_t g_iq1s[2048];
__device__ uint8_t g_ksigns[128];

// 8 magnitudes (bytes of `mags`) with signs (bit j of `negative`) dotted with 8 x values.
__device__ __forceinline__ float signed8_dot(uint64_t mags, uint8_t negative, const float4* xs) {
  float f[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float m = float(uint8_t(mags >> (8 * j)));
    f[j] = (negative >> j) & 1 ? -m : m;
  }
  return dot4(xs[0], f[0], f[1], f[2], f[3]) + dot4(xs[1], f[4], f[5], f[6], f[7]);
}

// IQ1: 8 values int8(byte j) + delta dotted with x.
__device__ __forceinline__ float iq1_8_dot(uint64_t entry, float delta, const float4* xs) {
  float f[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] = float(int8_t(uint8_t(entry >> (8 * j)))) + delta;
  return dot4(xs[0], f[0], f[1], f[2], f[3]) + dot4(xs[1], f[4], f[5], f[6], f[7]);
}

__device__ __forceinline__ uint32_t u32_at(const uint8_t* p) {  // 2-byte aligned
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}

__device__ __forceinline__ float iq2_scale(float d, int s) { return d * (0.5f + float(s)) * 0.25f; }

template <>
struct Unit<GgmlType::IQ2_XXS> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const BlockIQ2_XXS& b = reinterpret_cast<const BlockIQ2_XXS*>(row)[u / 8];
    const uint8_t* group = reinterpret_cast<const uint8_t*>(b.qs) + 8 * (u % 8);
    const uint32_t word = u32_at(group + 4);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) s += signed8_dot(g_iq2xxs[group[k]], g_ksigns[(word >> (7 * k)) & 127], xs + 2 * k);
    return iq2_scale(half_bits(b.d), int(word >> 28)) * s;
  }
};

template <>
struct Unit<GgmlType::IQ2_XS> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const BlockIQ2_XS& b = reinterpret_cast<const BlockIQ2_XS*>(row)[u / 8];
    const int sub = int(u % 8);
    const float d = half_bits(b.d);
    float s[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint16_t code = b.qs[4 * sub + k];
      s[k / 2] += signed8_dot(g_iq2xs[code & 511], g_ksigns[code >> 9], xs + 2 * k);
    }
    return iq2_scale(d, b.scales[sub] & 15) * s[0] + iq2_scale(d, b.scales[sub] >> 4) * s[1];
  }
};

template <>
struct Unit<GgmlType::IQ2_S> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const BlockIQ2_S& b = reinterpret_cast<const BlockIQ2_S*>(row)[u / 8];
    const int sub = int(u % 8);
    const float d = half_bits(b.d);
    float s[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int g = 4 * sub + k;
      const int index = b.qs[g] | ((b.qh[sub] >> (2 * k)) & 3) << 8;
      s[k / 2] += signed8_dot(g_iq2s[index], b.qs[QK_K / 8 + g], xs + 2 * k);
    }
    return iq2_scale(d, b.scales[sub] & 15) * s[0] + iq2_scale(d, b.scales[sub] >> 4) * s[1];
  }
};

template <>
struct Unit<GgmlType::IQ3_XXS> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const BlockIQ3_XXS& b = reinterpret_cast<const BlockIQ3_XXS*>(row)[u / 8];
    const int sub = int(u % 8);
    const uint32_t word = u32_at(b.qs + QK_K / 4 + 4 * sub);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint8_t* pair = b.qs + 8 * sub + 2 * k;
      const uint64_t mags = uint64_t(g_iq3xxs[pair[0]]) | uint64_t(g_iq3xxs[pair[1]]) << 32;
      s += signed8_dot(mags, g_ksigns[(word >> (7 * k)) & 127], xs + 2 * k);
    }
    return half_bits(b.d) * (0.5f + float(word >> 28)) * 0.5f * s;
  }
};

template <>
struct Unit<GgmlType::IQ3_S> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const BlockIQ3_S& b = reinterpret_cast<const BlockIQ3_S*>(row)[u / 8];
    const int sub = int(u % 8);
    const int scale = (b.scales[sub / 2] >> (4 * (sub % 2))) & 15;
    const uint8_t* low = b.qs + 8 * sub;
    const int high = b.qh[sub];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int first = low[2 * k] | ((high >> (2 * k)) & 1) << 8;
      const int second = low[2 * k + 1] | ((high >> (2 * k + 1)) & 1) << 8;
      const uint64_t mags = uint64_t(g_iq3s[first]) | uint64_t(g_iq3s[second]) << 32;
      s += signed8_dot(mags, b.signs[4 * sub + k], xs + 2 * k);
    }
    return half_bits(b.d) * float(1 + 2 * scale) * s;
  }
};

template <>
struct Unit<GgmlType::IQ1_S> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const BlockIQ1_S& b = reinterpret_cast<const BlockIQ1_S*>(row)[u / 8];
    const int sub = int(u % 8);
    const int high = b.qh[sub];
    const float delta = (high & 0x8000) ? -0.125f : 0.125f;
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) s += iq1_8_dot(g_iq1s[b.qs[4 * sub + k] | ((high >> (3 * k)) & 7) << 8], delta, xs + 2 * k);
    return half_bits(b.d) * float(2 * ((high >> 12) & 7) + 1) * s;
  }
};

template <>
struct Unit<GgmlType::IQ1_M> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const BlockIQ1_M& b = reinterpret_cast<const BlockIQ1_M*>(row)[u / 8];
    const int sub = int(u % 8);
    uint16_t words[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) words[w] = uint16_t(b.scales[2 * w] | (b.scales[2 * w + 1] << 8));
    const float d = half_bits(uint16_t((words[0] >> 12) | (words[1] >> 12) << 4 | (words[2] >> 12) << 8 |
                                       (words[3] >> 12) << 12));
    const int scale_bits = words[sub / 2] >> (6 * (sub % 2));
    float s[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int nibble = (b.qh[2 * sub + k / 2] >> (4 * (k % 2))) & 15;
      const int index = b.qs[4 * sub + k] | (nibble & 7) << 8;
      s[k / 2] += iq1_8_dot(g_iq1s[index], (nibble & 8) ? -0.125f : 0.125f, xs + 2 * k);
    }
    return d * float(2 * (scale_bits & 7) + 1) * s[0] + d * float(2 * ((scale_bits >> 3) & 7) + 1) * s[1];
  }
};

// The 32 nibbles (shift 0 or 4) of 32 bytes at q (16-byte aligned) dotted with xs, and sum(xs).
__device__ __forceinline__ void nibble_dot(const uint4* q, int shift, const float4* xs, const uint4* high,
                                           int high_bit, float* s, float* sx) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint4 v = __ldg(q + half);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    uint32_t hwords[4] = {0, 0, 0, 0};
    if (high) {
      const uint4 h = __ldg(high + half);
      hwords[0] = h.x, hwords[1] = h.y, hwords[2] = h.z, hwords[3] = h.w;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float f[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int q4 = int((words[k] >> (8 * j + shift)) & 15);
        if (high) q4 |= int((hwords[k] >> (8 * j + high_bit)) & 1) << 4;
        f[j] = float(q4);
      }
      const float4 x = xs[4 * half + k];
      *s += dot4(x, f[0], f[1], f[2], f[3]);
      *sx += x.x + x.y + x.z + x.w;
    }
  }
}

template <>
struct Unit<GgmlType::Q4_K> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const BlockQ4_K& b = reinterpret_cast<const BlockQ4_K*>(row)[u / 8];
    const int sub = int(u % 8);
    float scale, min, s = 0.0f, sx = 0.0f;
    scale_min_k4(b.scales, sub, &scale, &min);
    nibble_dot(reinterpret_cast<const uint4*>(b.qs + 32 * (sub / 2)), 4 * (sub % 2), xs, nullptr, 0, &s, &sx);
    return half_bits(b.d) * scale * s - half_bits(b.dmin) * min * sx;
  }
};

template <>
struct Unit<GgmlType::Q5_K> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const BlockQ5_K& b = reinterpret_cast<const BlockQ5_K*>(row)[u / 8];
    const int sub = int(u % 8);
    float scale, min, s = 0.0f, sx = 0.0f;
    scale_min_k4(b.scales, sub, &scale, &min);
    nibble_dot(reinterpret_cast<const uint4*>(b.qs + 32 * (sub / 2)), 4 * (sub % 2), xs,
               reinterpret_cast<const uint4*>(b.qh), sub, &s, &sx);
    return half_bits(b.d) * scale * s - half_bits(b.dmin) * min * sx;
  }
};

template <>
struct Unit<GgmlType::Q6_K> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float4* xs) {
    const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[u / 8];
    const int unit = int(u % 8), half = unit / 4, quarter = unit % 4;
    const uint16_t* low = reinterpret_cast<const uint16_t*>(b.ql + 64 * half + 32 * (quarter % 2));
    const uint16_t* qh = reinterpret_cast<const uint16_t*>(b.qh + 32 * half);
    const int low_shift = 4 * (quarter / 2), high_shift = 2 * quarter;
    float s[2] = {0.0f, 0.0f};  // the unit's two 16-value sub-blocks
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint16_t l0 = __ldg(low + 2 * k), l1 = __ldg(low + 2 * k + 1);
      const uint16_t h0 = __ldg(qh + 2 * k), h1 = __ldg(qh + 2 * k + 1);
      const uint32_t l = uint32_t(l0) | (uint32_t(l1) << 16), h = uint32_t(h0) | (uint32_t(h1) << 16);
      float f[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        f[j] = float(int(((l >> (8 * j + low_shift)) & 15) | (((h >> (8 * j + high_shift)) & 3) << 4)) - 32);
      s[k / 4] += dot4(xs[k], f[0], f[1], f[2], f[3]);
    }
    const int sub = 8 * half + 2 * quarter;
    return half_bits(b.d) * (float(b.scales[sub]) * s[0] + float(b.scales[sub + 1]) * s[1]);
  }
};

constexpr int kWarpsPerBlock = 8;

template <GgmlType T>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp)
    matvec_kernel(const uint8_t* w, const void* const* table, const int32_t* ids, int64_t rows, int64_t units,
                  size_t row_bytes, const float* x, ProblemIo io, float* y, int rows_per_warp, int64_t swiglu_up) {
  extern __shared__ float4 shared_x[];
  float* xs = reinterpret_cast<float*>(shared_x);
  const int64_t p = blockIdx.y;  // the problem
  const float* xp = x + io.x_at(p);
  // The warp's first row on its way from memory while x is staged (and, for a plain matrix, while
  // the kernel before this one finishes: the expert table's ids come from that kernel).
  const auto prefetch_first_row = [&] {
    const int64_t r = int64_t(blockIdx.x) * rows_per_warp * (blockDim.x / kWarp) + threadIdx.x / kWarp;
    if (r < rows)
      kernels::prefetch_lines((table ? static_cast<const uint8_t*>(table[ids[p]]) : w) + r * row_bytes,
                              int64_t(row_bytes), threadIdx.x % kWarp, kWarp);
  };
  if (!table) prefetch_first_row();
  kernels::begin_after_inputs();
  if (table) prefetch_first_row();
  for (int64_t i = threadIdx.x; i < units * 32; i += blockDim.x)
    xs[(i / 32) * kUnitStride + i % 32] = input_value(xp, i, swiglu_up);
  __syncthreads();
  const uint8_t* matrix = table ? static_cast<const uint8_t*>(table[ids[p]]) : w;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  for (int k = 0; k < rows_per_warp; ++k) {
    const int64_t r = (int64_t(blockIdx.x) * rows_per_warp + k) * warps + warp;
    if (r >= rows) return;
    const uint8_t* row = matrix + r * row_bytes;
    float sum = 0.0f;
    for (int64_t u = lane; u < units; u += kWarp)
      sum += Unit<T>::dot(row, u, reinterpret_cast<const float4*>(xs + u * kUnitStride));
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) y[p * io.y_stride + r] = sum;
  }
}

// Plain float rows whose length is not a multiple of 32 (tiny test models): one warp per row, lanes
// striding over the values, x read from global memory.
template <GgmlType T>
__device__ __forceinline__ float plain_value(const uint8_t* row, int64_t c) {
  if constexpr (T == GgmlType::F32) return reinterpret_cast<const float*>(row)[c];
  const uint16_t bits = reinterpret_cast<const uint16_t*>(row)[c];
  if constexpr (T == GgmlType::F16) return half_bits(bits);
  return __uint_as_float(uint32_t(bits) << 16);
}

template <GgmlType T>
__global__ void matvec_ragged_kernel(const uint8_t* w, const void* const* table, const int32_t* ids, int64_t rows,
                                     int64_t cols, size_t row_bytes, const float* x, ProblemIo io, float* y,
                                     int64_t swiglu_up) {
  kernels::begin_after_inputs();
  const int lane = threadIdx.x % kWarp;
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  const int64_t p = blockIdx.y;
  if (r >= rows) return;
  const uint8_t* row = (table ? static_cast<const uint8_t*>(table[ids[p]]) : w) + r * row_bytes;
  const float* xp = x + io.x_at(p);
  float sum = 0.0f;
  for (int64_t c = lane; c < cols; c += kWarp) sum += plain_value<T>(row, c) * input_value(xp, c, swiglu_up);
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) y[p * io.y_stride + r] = sum;
}

template <GgmlType T>
cudaError_t launch(const MatvecLaunch& m) {
  if constexpr (cuda_weight_type(T)->plain) {
    if (m.cols % 32 != 0) {
      const dim3 grid(unsigned((m.rows + kWarpsPerBlock - 1) / kWarpsPerBlock), unsigned(m.n_problems));
      return kernels::launch_overlapped(matvec_ragged_kernel<T>, grid, dim3(kWarpsPerBlock * kWarp), 0, m.stream,
                                        static_cast<const uint8_t*>(m.w), m.table, m.ids, m.rows, m.cols, m.row_bytes,
                                        m.x, m.io, m.y, m.swiglu_up);
    }
  }
  const int64_t units = m.cols / 32;
  const size_t shared = size_t(units) * kUnitStride * sizeof(float);
  if (const cudaError_t err = kernels::allow_shared(matvec_kernel<T>, shared)) return err;
  // Two rows per warp share the staging of x; small products keep one, so there are enough blocks
  // to fill the GPU (a few thousand rows in all). (Blocks of two warps for the router's few hundred
  // rows measured slower on the H200: each block stages all of x.)
  const int rows_per_warp = m.rows * m.n_problems >= 16384 ? 2 : 1;
  const int64_t rows_per_block = int64_t(kWarpsPerBlock) * rows_per_warp;
  const dim3 grid(unsigned((m.rows + rows_per_block - 1) / rows_per_block), unsigned(m.n_problems));
  return kernels::launch_overlapped(matvec_kernel<T>, grid, dim3(kWarpsPerBlock * kWarp), shared, m.stream,
                                    static_cast<const uint8_t*>(m.w), m.table, m.ids, m.rows, units, m.row_bytes, m.x,
                                    m.io, m.y, rows_per_warp, m.swiglu_up);
}

}  // namespace

const char* launch_matvec(const MatvecLaunch& m) {
  if (m.q8_input && read_by(m.type, WeightKernel::q8)) return kernels::error_text(launch_matvec_q8(m));
  cudaError_t err = cudaSuccess;
  if (!for_weight_type<WeightKernel::dot>(m.type, [&](auto t) { err = launch<decltype(t)::value>(m); }))
    return "no kernel for this type";
  return kernels::error_text(err);
}

const char* upload_iq_grids(const IqGrids& grids) {
  const std::pair<const void*, std::pair<const void*, size_t>> copies[] = {
      {g_iq2xxs, {grids.iq2xxs, sizeof(g_iq2xxs)}}, {g_iq2xs, {grids.iq2xs, sizeof(g_iq2xs)}},
      {g_iq2s, {grids.iq2s, sizeof(g_iq2s)}},       {g_iq3xxs, {grids.iq3xxs, sizeof(g_iq3xxs)}},
      {g_iq3s, {grids.iq3s, sizeof(g_iq3s)}},       {g_iq1s, {grids.iq1s, sizeof(g_iq1s)}},
      {g_ksigns, {grids.ksigns, sizeof(g_ksigns)}}};
  for (const auto& [symbol, source] : copies) {
    const cudaError_t err = cudaMemcpyToSymbol(symbol, source.first, source.second);
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

}  // namespace lode::cuda
