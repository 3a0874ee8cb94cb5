// The 32-value block formats (q4_0, q4_1, q5_0, q5_1, q8_0): dequantizers bit-exact with ggml and
// the two quantizers ggml's reference rules fully determine (q4_0, q8_0), byte-identical with them.
//
// Value i of a block (0..31) is stored in nibble form as: i < 16 -> low nibble of qs[i],
// i >= 16 -> high nibble of qs[i - 16]. The 5-bit formats keep bit 4 of value i in bit i of the
// little-endian 32-bit word qh.
//
// Bit-exactness rests on doing the very float operations ggml does, in its order. Dequantizing,
// (code - offset) * d is exact (at most 5 x 11 significant bits), so only the "+ m" rounds.
// Quantizing, x * (1/d) + 8.5 rounds twice in ggml; a fused multiply-add would round once and can
// land on the other side of an integer, so contraction is switched off for this file (it only
// happens at all when building for an FMA target).
#include <cmath>
#include <cstdint>

#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/dequant.h"

#pragma GCC optimize("fp-contract=off")

namespace lode::quant {
namespace {

constexpr int kHalf = 16;  // values per nibble half of a 32-value block

uint32_t high_bits(const uint8_t qh[4]) {
  return uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24;
}

// ggml converts float to a small integer with a plain C cast, which x86 performs as a truncating
// conversion to int32 (NaN and out-of-range values give INT32_MIN) and then keeps the low byte.
// These two helpers do the same thing without relying on undefined behaviour.
int32_t truncate_to_int32(float v) {
  if (!(v > -2147483904.0f && v < 2147483648.0f)) return INT32_MIN;
  return int32_t(v);
}
int8_t low_byte(int32_t v) { return int8_t(uint8_t(uint32_t(v) & 0xff)); }

// q4_0's code for one value already scaled to [-8, 8]: shift by 8, round half up (by adding 0.5
// and truncating), keep at most 15. The clamp is a signed compare, as in ggml.
uint8_t q4_0_code(float scaled) {
  const int8_t code = low_byte(truncate_to_int32(scaled + 8.5f));
  return uint8_t(code < 15 ? code : 15);
}

}  // namespace

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_0*>(src);
  for (int64_t b = 0; b < n / QK4_0; ++b, dst += QK4_0) {
    const BlockQ4_0& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    for (int j = 0; j < kHalf; ++j) {
      dst[j] = float((block.qs[j] & 0x0f) - 8) * d;
      dst[j + kHalf] = float((block.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_1*>(src);
  for (int64_t b = 0; b < n / QK4_1; ++b, dst += QK4_1) {
    const BlockQ4_1& block = blocks[b];
    const float d = fp16_to_fp32(block.d), m = fp16_to_fp32(block.m);
    for (int j = 0; j < kHalf; ++j) {
      dst[j] = float(block.qs[j] & 0x0f) * d + m;
      dst[j + kHalf] = float(block.qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_0*>(src);
  for (int64_t b = 0; b < n / QK5_0; ++b, dst += QK5_0) {
    const BlockQ5_0& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    const uint32_t qh = high_bits(block.qh);
    for (int j = 0; j < kHalf; ++j) {
      const int low = (block.qs[j] & 0x0f) | int((qh >> j) & 1) << 4;
      const int high = (block.qs[j] >> 4) | int((qh >> (j + kHalf)) & 1) << 4;
      dst[j] = float(low - 16) * d;
      dst[j + kHalf] = float(high - 16) * d;
    }
  }
}

void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_1*>(src);
  for (int64_t b = 0; b < n / QK5_1; ++b, dst += QK5_1) {
    const BlockQ5_1& block = blocks[b];
    const float d = fp16_to_fp32(block.d), m = fp16_to_fp32(block.m);
    const uint32_t qh = high_bits(block.qh);
    for (int j = 0; j < kHalf; ++j) {
      const int low = (block.qs[j] & 0x0f) | int((qh >> j) & 1) << 4;
      const int high = (block.qs[j] >> 4) | int((qh >> (j + kHalf)) & 1) << 4;
      dst[j] = float(low) * d + m;
      dst[j + kHalf] = float(high) * d + m;
    }
  }
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / QK8_0; ++b, dst += QK8_0) {
    const BlockQ8_0& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    for (int j = 0; j < QK8_0; ++j) dst[j] = float(block.qs[j]) * d;
  }
}

// q4_0: the scale comes from the value of largest magnitude, sign included (the first one on a
// tie), so that value maps to code 0 (-8) exactly and the other side gets the spare code.
// d = max / -8 is stored as fp16, but the codes use 1/d of the unrounded float d.
void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_0*>(dst);
  for (int64_t b = 0; b < n / QK4_0; ++b, src += QK4_0) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK4_0; ++j) {
      if (std::fabs(src[j]) > amax) {
        amax = std::fabs(src[j]);
        max = src[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_0& block = blocks[b];
    block.d = fp32_to_fp16(d);
    for (int j = 0; j < kHalf; ++j) {
      const uint8_t low = q4_0_code(src[j] * id), high = q4_0_code(src[j + kHalf] * id);
      block.qs[j] = uint8_t(low | high << 4);
    }
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
