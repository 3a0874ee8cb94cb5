// The 32-value block formats (q4_0, q4_1, q5_0, q5_1, q8_0): dequantizers bit-exact with ggml, and
// quantizers byte-identical with ggml's reference ones (their rules leave no choice to make).
//
// Bit-exactness rests on doing the very float operations ggml does, in its order. Dequantizing,
// (code - offset) * d is exact (at most 8 + 11 significant bits), so only the "+ m" rounds.
// Quantizing, x * (1/d) + 8.5 rounds twice in ggml; a fused multiply-add would round once and can
// land on the other side of an integer, so contraction is switched off for this file (it only
// happens at all when building for an FMA target).
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/dequant.h"

#pragma GCC optimize("fp-contract=off")

namespace lode::quant {
namespace {

constexpr int kHalf = 16;  // values per nibble half of a 32-value block

// Value i of a block: the low nibble of qs[i] for i < 16, the high nibble of qs[i - 16] after.
void unpack_nibbles(const uint8_t qs[kHalf], int8_t code[32]) {
  for (int j = 0; j < kHalf; ++j) {
    code[j] = int8_t(qs[j] & 0x0f);
    code[j + kHalf] = int8_t(qs[j] >> 4);
  }
}

// The 5-bit formats: bit 4 of value i is bit i of qh, so qh byte k serves values 8k..8k+7. Each
// byte is spread over 8 code bytes at once: multiplying by 0x0101.. copies it into every byte lane,
// the mask keeps bit j in lane j, and adding 0x7f to a lane carries into its top bit exactly when
// that bit is set (lanes hold at most 0x80, so no carry crosses lanes).
void add_high_bits(const uint8_t qh[4], int8_t code[32]) {
  static_assert(std::endian::native == std::endian::little, "lane j must be byte j in memory");
  for (int k = 0; k < 4; ++k) {
    const uint64_t lanes = (uint64_t(qh[k]) * 0x0101010101010101ull) & 0x8040201008040201ull;
    const uint64_t bit4 = ((lanes + 0x7f7f7f7f7f7f7f7full) & 0x8080808080808080ull) >> 3;
    uint64_t eight;
    std::memcpy(&eight, code + 8 * k, 8);
    eight |= bit4;
    std::memcpy(code + 8 * k, &eight, 8);
  }
}

// One block's floats from its codes: (code - offset) * d, or code * d + m for the formats with a
// minimum. The restrict pointers tell the compiler that dst cannot overlap the codes (block bytes
// may alias anything otherwise), which is what lets it vectorize these loops.
void scale_codes(const int8_t* __restrict code, int offset, float d, float* __restrict out) {
  for (int i = 0; i < 32; ++i) out[i] = float(code[i] - offset) * d;
}
void scale_codes_add_min(const int8_t* __restrict code, float d, float m, float* __restrict out) {
  for (int i = 0; i < 32; ++i) out[i] = float(code[i]) * d + m;
}

// ggml converts float to a small integer with a plain C cast, which x86 performs as a truncating
// conversion to int32 (NaN and out-of-range values give INT32_MIN) and then keeps the low byte.
// These two helpers do the same thing without relying on undefined behaviour.
int32_t truncate_to_int32(float v) {
  if (!(v > -2147483904.0f && v < 2147483648.0f)) return INT32_MIN;
  return int32_t(v);
}
int8_t low_byte(int32_t v) { return int8_t(uint8_t(uint32_t(v) & 0xff)); }

// The code of a value already scaled and shifted so that its code is the integer part: ggml's
// (int8_t) cast, then "at most top" as a signed compare (so a wrapped negative byte passes through).
uint8_t clamped_code(float shifted, int8_t top) {
  const int8_t code = low_byte(truncate_to_int32(shifted));
  return uint8_t(code < top ? code : top);
}

// The value of largest magnitude, sign included; the first one wins a tie and NaNs never win.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// The smallest and largest value, each kept only by a strict compare, so NaNs are skipped; a block
// of NaNs only leaves the starting values (FLT_MAX, -FLT_MAX), as in ggml.
struct ValueRange {
  float min = FLT_MAX, max = -FLT_MAX;
};
ValueRange value_range(const float* x, int n) {
  ValueRange r;
  for (int j = 0; j < n; ++j) {
    if (x[j] < r.min) r.min = x[j];
    if (x[j] > r.max) r.max = x[j];
  }
  return r;
}

// ggml's guard against a zero scale: 1/d, or 0 when d is zero (NaN d counts as nonzero).
float inverse_or_zero(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

// Packs 32 codes of up to 5 bits: low nibbles as unpack_nibbles reads them, bit 4 of code i into
// bit i of qh (little-endian), as add_high_bits reads it.
void pack_5bit_codes(const uint8_t code[32], uint8_t qs[kHalf], uint8_t qh[4]) {
  uint32_t high = 0;
  for (int j = 0; j < kHalf; ++j) {
    qs[j] = uint8_t((code[j] & 0x0f) | (code[j + kHalf] & 0x0f) << 4);
    high |= uint32_t(code[j] >> 4 & 1) << j;
    high |= uint32_t(code[j + kHalf] >> 4 & 1) << (j + kHalf);
  }
  for (int k = 0; k < 4; ++k) qh[k] = uint8_t(high >> (8 * k));
}

}  // namespace

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_0*>(src);
  for (int64_t b = 0; b < n / QK4_0; ++b, dst += QK4_0) {
    int8_t code[QK4_0];
    unpack_nibbles(blocks[b].qs, code);
    scale_codes(code, 8, fp16_to_fp32(blocks[b].d), dst);
  }
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_1*>(src);
  for (int64_t b = 0; b < n / QK4_1; ++b, dst += QK4_1) {
    int8_t code[QK4_1];
    unpack_nibbles(blocks[b].qs, code);
    scale_codes_add_min(code, fp16_to_fp32(blocks[b].d), fp16_to_fp32(blocks[b].m), dst);
  }
}

void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_0*>(src);
  for (int64_t b = 0; b < n / QK5_0; ++b, dst += QK5_0) {
    int8_t code[QK5_0];
    unpack_nibbles(blocks[b].qs, code);
    add_high_bits(blocks[b].qh, code);
    scale_codes(code, 16, fp16_to_fp32(blocks[b].d), dst);
  }
}

void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_1*>(src);
  for (int64_t b = 0; b < n / QK5_1; ++b, dst += QK5_1) {
    int8_t code[QK5_1];
    unpack_nibbles(blocks[b].qs, code);
    add_high_bits(blocks[b].qh, code);
    scale_codes_add_min(code, fp16_to_fp32(blocks[b].d), fp16_to_fp32(blocks[b].m), dst);
  }
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / QK8_0; ++b, dst += QK8_0)
    scale_codes(blocks[b].qs, 0, fp16_to_fp32(blocks[b].d), dst);
}

// q4_0: the scale comes from the value of largest magnitude, sign included (the first one on a
// tie), so that value maps to code 0 (-8) exactly and the other side gets the spare code.
// d = max / -8 is stored as fp16, but the codes use 1/d of the unrounded float d. Codes round half
// up (x / d + 8.5, truncated) and are at most 15.
void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_0*>(dst);
  for (int64_t b = 0; b < n / QK4_0; ++b, src += QK4_0) {
    const float d = signed_absmax(src, QK4_0) / -8.0f;
    const float id = inverse_or_zero(d);
    BlockQ4_0& block = blocks[b];
    block.d = fp32_to_fp16(d);
    for (int j = 0; j < kHalf; ++j) {
      const uint8_t low = clamped_code(src[j] * id + 8.5f, 15);
      const uint8_t high = clamped_code(src[j + kHalf] * id + 8.5f, 15);
      block.qs[j] = uint8_t(low | high << 4);
    }
  }
}

// q4_1: the 16 codes span [min, max] evenly, d = (max - min) / 15 and m = min (both stored as
// fp16; the codes use the unrounded min and 1/d). Codes round half up: (x - min) / d + 0.5,
// truncated, at most 15.
void quantize_row_q4_1(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_1*>(dst);
  for (int64_t b = 0; b < n / QK4_1; ++b, src += QK4_1) {
    const ValueRange r = value_range(src, QK4_1);
    const float d = (r.max - r.min) / 15.0f;
    const float id = inverse_or_zero(d);
    BlockQ4_1& block = blocks[b];
    block.d = fp32_to_fp16(d);
    block.m = fp32_to_fp16(r.min);
    for (int j = 0; j < kHalf; ++j) {
      const uint8_t low = clamped_code((src[j] - r.min) * id + 0.5f, 15);
      const uint8_t high = clamped_code((src[j + kHalf] - r.min) * id + 0.5f, 15);
      block.qs[j] = uint8_t(low | high << 4);
    }
  }
}

// q5_0: q4_0 with 32 codes. d = max / -16 from the signed largest magnitude, codes
// x / d + 16.5 truncated, at most 31.
void quantize_row_q5_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ5_0*>(dst);
  for (int64_t b = 0; b < n / QK5_0; ++b, src += QK5_0) {
    const float d = signed_absmax(src, QK5_0) / -16.0f;
    const float id = inverse_or_zero(d);
    uint8_t code[QK5_0];
    for (int j = 0; j < QK5_0; ++j) code[j] = clamped_code(src[j] * id + 16.5f, 31);
    blocks[b].d = fp32_to_fp16(d);
    pack_5bit_codes(code, blocks[b].qs, blocks[b].qh);
  }
}

// q5_1: q4_1 with 32 codes, d = (max - min) / 31. ggml does not clamp these codes: it casts to
// uint8_t, which keeps the low byte of the truncated value, and stores only its low 5 bits.
void quantize_row_q5_1(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ5_1*>(dst);
  for (int64_t b = 0; b < n / QK5_1; ++b, src += QK5_1) {
    const ValueRange r = value_range(src, QK5_1);
    const float d = (r.max - r.min) / 31.0f;
    const float id = inverse_or_zero(d);
    uint8_t code[QK5_1];
    for (int j = 0; j < QK5_1; ++j)
      code[j] = uint8_t(low_byte(truncate_to_int32((src[j] - r.min) * id + 0.5f)));
    blocks[b].d = fp32_to_fp16(d);
    blocks[b].m = fp32_to_fp16(r.min);
    pack_5bit_codes(code, blocks[b].qs, blocks[b].qh);
  }
}

// q8_0: symmetric, d = amax / 127 (a true division), codes round half away from zero. The running
// max is written as ggml's is, so NaNs behave the same: one sticks only when it is the last value.
void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / QK8_0; ++b, src += QK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) {
      const float a = std::fabs(src[j]);
      amax = amax > a ? amax : a;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0& block = blocks[b];
    block.d = fp32_to_fp16(d);
    for (int j = 0; j < QK8_0; ++j) block.qs[j] = low_byte(truncate_to_int32(std::round(src[j] * id)));
  }
}

}  // namespace lode::quant
