// Device access to paged K/V rows (cuda/kv_format.h), one side's store at compile time, so the
// attention kernels carry no per-element branch on the format. The writers reproduce kv/codec.h's
// reference quantizers bit for bit: the same float operations in the same order, with no fused
// multiply-adds where the host rounds twice, and x86's float-to-int conversion where ggml's q4_0
// rule relies on it. Included by .cu files only.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kv_format.h"

namespace lode::cuda {

using kv::Store;

constexpr int kKvInt8Group = 64;  // values per int8 scale
constexpr int kKvQ4Values = 32;   // values per q4_0 block
constexpr int kKvQ4Bytes = 18;    // fp16 d, then 16 bytes of nibbles
constexpr int kKvMaxHeadDim = 512;

// The row of position `pos` in a paged store of row_bytes per position.
__device__ __forceinline__ uint8_t* kv_row(void* store, const int32_t* pages, int64_t pos, int64_t row_bytes) {
  const int64_t physical = int64_t(pages[pos / kKvPagePositions]) * kKvPagePositions + pos % kKvPagePositions;
  return static_cast<uint8_t*>(store) + physical * row_bytes;
}

// Where row t of a step sits (KvView::row_sequence): its position, and its sequence's page table.
struct RowPlace {
  int64_t position;
  const int32_t* pages;
};
__device__ __forceinline__ RowPlace row_place(const KvView& kv, const int64_t* position, int t) {
  if (kv.row_sequence) return {position[t], kv.pages + int64_t(kv.row_sequence[t]) * kv.pages_stride};
  return {*position + t, kv.pages};
}

// x <- H·x for the n (a power of two) values at x, by the whole block: kv::hadamard's butterflies
// stage by stage (span 1, 2, 4, ...), then the scale 1/sqrt(n), so the result is the host's to the bit.
__device__ inline void block_hadamard(float* x, int n) {
  __syncthreads();
  for (int span = 1; span < n; span <<= 1) {
    for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
      const int j = p / span * 2 * span + p % span;
      const float a = x[j], b = x[j + span];
      x[j] = a + b;
      x[j + span] = a - b;
    }
    __syncthreads();
  }
  const float norm = 1.0f / sqrtf(float(n));
  for (int j = threadIdx.x; j < n; j += blockDim.x) x[j] *= norm;
  __syncthreads();
}

// ggml's q4_0 codes are a C cast of float to int8: on x86 a truncating conversion to int32 (NaN and
// out-of-range values give INT32_MIN), then the low byte; the host reference does the same.
__device__ __forceinline__ uint8_t q4_clamped_code(float shifted) {
  const bool representable = shifted > -2147483904.0f && shifted < 2147483648.0f;  // NaN: false
  const int32_t wide = representable ? __float2int_rz(shifted) : INT32_MIN;
  const auto code = int8_t(wide & 0xff);
  return uint8_t(code < 15 ? code : 15);
}

// The value of largest magnitude in a warp's 32 values, sign included, the first lane winning a
// tie and NaN never winning (+0 when all are zero): signed_absmax of the host's q4_0 rule.
__device__ __forceinline__ float warp_signed_absmax(float v) {
  const unsigned lane = threadIdx.x % 32;
  float amax = fabsf(v) > 0.0f ? fabsf(v) : 0.0f, value = amax > 0.0f ? v : 0.0f;
  int index = amax > 0.0f ? int(lane) : 32;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_amax = __shfl_xor_sync(0xffffffffu, amax, offset);
    const float other_value = __shfl_xor_sync(0xffffffffu, value, offset);
    const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
    if (other_amax > amax || (other_amax == amax && other_index < index))
      amax = other_amax, value = other_value, index = other_index;
  }
  return value;
}

__device__ __forceinline__ float warp_abs_max(float a) {
  for (int offset = 16; offset > 0; offset >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, offset));
  return a;
}

// One store's access: load(row, row_values, i) is value i of a row in the stored domain (for q4r
// the rotated vector), load8 the 8 values from i (a multiple of 8) on, the same floats; encode_head writes values [first, first + head_dim) of a row from x (shared
// memory, head_dim values, which it may overwrite), called by every thread of the block.
template <Store S>
struct KvSide;

template <>
struct KvSide<Store::f32> {
  static constexpr bool rotated = false;
  __device__ static float load(const uint8_t* row, int64_t, int64_t i) { return reinterpret_cast<const float*>(row)[i]; }
  __device__ static void load8(const uint8_t* row, int64_t, int64_t i, float out[8]) {
    const float4 a = reinterpret_cast<const float4*>(row)[i / 4], b = reinterpret_cast<const float4*>(row)[i / 4 + 1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  }
  __device__ static void encode_head(float* x, uint8_t* row, int64_t, int64_t first, int head_dim) {
    __syncthreads();
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) reinterpret_cast<float*>(row)[first + i] = x[i];
  }
};

template <>
struct KvSide<Store::f16> {
  static constexpr bool rotated = false;
  __device__ static float load(const uint8_t* row, int64_t, int64_t i) {
    return __half2float(reinterpret_cast<const __half*>(row)[i]);
  }
  __device__ static void load8(const uint8_t* row, int64_t, int64_t i, float out[8]) {
    const uint4 word = reinterpret_cast<const uint4*>(row)[i / 8];
    const unsigned parts[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 pair = __half22float2(*reinterpret_cast<const __half2*>(&parts[k]));
      out[2 * k] = pair.x, out[2 * k + 1] = pair.y;
    }
  }
  __device__ static void encode_head(float* x, uint8_t* row, int64_t, int64_t first, int head_dim) {
    __syncthreads();
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x)
      reinterpret_cast<__half*>(row)[first + i] = __float2half_rn(x[i]);
  }
};

// All the row's codes, then one fp16 scale per 64 values (kv::quantize_int8_group): a warp per group.
template <>
struct KvSide<Store::i8> {
  static constexpr bool rotated = false;
  __device__ static float load(const uint8_t* row, int64_t row_values, int64_t i) {
    const float scale = __half2float(reinterpret_cast<const __half*>(row + row_values)[i / kKvInt8Group]);
    return float(reinterpret_cast<const int8_t*>(row)[i]) * scale;
  }
  // Rows are only 2-byte aligned (row bytes are values * 33 / 32), so the codes come as halfwords.
  __device__ static void load8(const uint8_t* row, int64_t row_values, int64_t i, float out[8]) {
    const float scale = __half2float(reinterpret_cast<const __half*>(row + row_values)[i / kKvInt8Group]);
    const auto* codes = reinterpret_cast<const unsigned short*>(row + i);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const unsigned short pair = codes[k];
      out[2 * k] = float(int8_t(pair & 0xff)) * scale;
      out[2 * k + 1] = float(int8_t(pair >> 8)) * scale;
    }
  }
  __device__ static void encode_head(float* x, uint8_t* row, int64_t row_values, int64_t first, int head_dim) {
    __syncthreads();
    const int lane = threadIdx.x % 32;
    for (int g = threadIdx.x / 32; g < head_dim / kKvInt8Group; g += blockDim.x / 32) {
      const float a = x[g * kKvInt8Group + lane], b = x[g * kKvInt8Group + 32 + lane];
      const float amax = warp_abs_max(fmaxf(fmaxf(0.0f, fabsf(a)), fabsf(b)));  // NaNs drop out, as on the host
      unsigned short bits = __half_as_ushort(__float2half_rn(fminf(amax / 127.0f, 65504.0f)));
      const float stored = __half2float(__ushort_as_half(bits));
      if (stored == 0.0f || !isfinite(amax)) bits = 0;
      const auto code = [&](float v) {
        const float q = bits ? rintf(v / stored) : 0.0f;  // half to even, against the stored scale
        return int8_t(isnan(q) ? 0.0f : fminf(fmaxf(q, -127.0f), 127.0f));
      };
      auto* codes = reinterpret_cast<int8_t*>(row) + first + g * kKvInt8Group;
      codes[lane] = code(a);
      codes[32 + lane] = code(b);
      if (lane == 0) reinterpret_cast<unsigned short*>(row + row_values)[first / kKvInt8Group + g] = bits;
    }
  }
};

// ggml q4_0 blocks of the head (quant::quantize_row_q4_0): a warp per block of 32 values.
template <>
struct KvSide<Store::q4> {
  static constexpr bool rotated = false;
  __device__ static float load(const uint8_t* row, int64_t, int64_t i) {
    const uint8_t* block = row + i / kKvQ4Values * kKvQ4Bytes;
    const int j = int(i % kKvQ4Values);
    const uint8_t byte = block[2 + (j & 15)];
    return float((j < 16 ? byte & 15 : byte >> 4) - 8) * __half2float(*reinterpret_cast<const __half*>(block));
  }
  // Values j0 .. j0 + 7 of a block (j0 = 0, 8, 16, 24): low nibbles of bytes j0 .. (j0 < 16), else
  // high nibbles of bytes j0 - 16 ..; blocks are 18 bytes, so halfword loads.
  __device__ static void load8(const uint8_t* row, int64_t, int64_t i, float out[8]) {
    const uint8_t* block = row + i / kKvQ4Values * kKvQ4Bytes;
    const int j0 = int(i % kKvQ4Values), shift = j0 < 16 ? 0 : 4;
    const float d = __half2float(*reinterpret_cast<const __half*>(block));
    const auto* qs = reinterpret_cast<const unsigned short*>(block + 2 + (j0 & 15));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const unsigned pair = qs[k] >> shift;
      out[2 * k] = float(int(pair & 15) - 8) * d;
      out[2 * k + 1] = float(int(pair >> 8 & 15) - 8) * d;
    }
  }
  __device__ static void encode_head(float* x, uint8_t* row, int64_t, int64_t first, int head_dim) {
    __syncthreads();
    const int lane = threadIdx.x % 32;
    for (int b = threadIdx.x / 32; b < head_dim / kKvQ4Values; b += blockDim.x / 32) {
      const float v = x[b * kKvQ4Values + lane];
      const float d = warp_signed_absmax(v) / -8.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const uint8_t code = q4_clamped_code(__fadd_rn(__fmul_rn(v, id), 8.5f));
      const uint8_t high = uint8_t(__shfl_down_sync(0xffffffffu, unsigned(code), 16));
      uint8_t* block = row + (first / kKvQ4Values + b) * kKvQ4Bytes;
      if (lane == 0) *reinterpret_cast<unsigned short*>(block) = __half_as_ushort(__float2half_rn(d));
      if (lane < 16) block[2 + lane] = uint8_t(code | high << 4);
    }
  }
};

// q4 of the rotated head: the writer rotates, the readers see rotated values (attention rotates
// the query and its output instead).
template <>
struct KvSide<Store::q4r> {
  static constexpr bool rotated = true;
  __device__ static float load(const uint8_t* row, int64_t row_values, int64_t i) {
    return KvSide<Store::q4>::load(row, row_values, i);
  }
  __device__ static void load8(const uint8_t* row, int64_t row_values, int64_t i, float out[8]) {
    KvSide<Store::q4>::load8(row, row_values, i, out);
  }
  __device__ static void encode_head(float* x, uint8_t* row, int64_t row_values, int64_t first, int head_dim) {
    block_hadamard(x, head_dim);
    KvSide<Store::q4>::encode_head(x, row, row_values, first, head_dim);
  }
};

// Writes head h of position pos (K and V, head_dim values each at k and v) into the cache through
// the page table `pages` (kv's, or a row's: row_place), by the whole block; x: shared scratch of
// head_dim floats.
template <Store KS, Store VS>
__device__ void store_head(const KvView& kv, const int32_t* pages, const float* k, const float* v, int64_t pos, int h,
                           int heads, int head_dim, float* x) {
  const int64_t row_values = int64_t(heads) * head_dim, first = int64_t(h) * head_dim;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) x[i] = k[i];
  KvSide<KS>::encode_head(x, kv_row(kv.k, pages, pos, kv.k_row_bytes), row_values, first, head_dim);
  __syncthreads();
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) x[i] = v[i];
  KvSide<VS>::encode_head(x, kv_row(kv.v, pages, pos, kv.v_row_bytes), row_values, first, head_dim);
}

// The stores of each side of a format, as types: with_stores(format, fn) calls
// fn(KvStores<K, V>{}), so a host launcher picks a kernel instantiation once per launch.
template <Store K, Store V>
struct KvStores {
  static constexpr Store k = K, v = V;
};

template <typename Fn>
auto with_stores(KvFormat format, Fn&& fn) {
  switch (format) {
    case KvFormat::f16: return fn(KvStores<Store::f16, Store::f16>{});
    case KvFormat::k8v8: return fn(KvStores<Store::i8, Store::i8>{});
    case KvFormat::k8v32: return fn(KvStores<Store::i8, Store::f32>{});
    case KvFormat::k32v8: return fn(KvStores<Store::f32, Store::i8>{});
    case KvFormat::q4: return fn(KvStores<Store::q4r, Store::q4r>{});
    case KvFormat::k8v4: return fn(KvStores<Store::i8, Store::q4r>{});
    case KvFormat::q4_unrotated: return fn(KvStores<Store::q4, Store::q4>{});
    case KvFormat::f32: break;
  }
  return fn(KvStores<Store::f32, Store::f32>{});
}

}  // namespace lode::cuda
