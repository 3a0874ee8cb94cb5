// The 32-value block formats (q4_0, q4_1, q5_0, q5_1, q8_0): dequantizers bit-exact with ggml and
// the two quantizers ggml's reference rules fully determine (q4_0, q8_0), byte-identical with them.
//
// Bit-exactness rests on doing the very float operations ggml does, in its order. Dequantizing,
// (code - offset) * d is exact (at most 8 + 11 significant bits), so only the "+ m" rounds.
// Quantizing, x * (1/d) + 8.5 rounds twice in ggml; a fused multiply-add would round once and can
// land on the other side of an integer, so contraction is switched off for this file (it only
// happens at all when building for an FMA target).
#include <bit>
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
