// Dequantizers of the k-quants (Q2_K .. Q6_K): 256-value super-blocks with per-sub-block scales.
// Bit-exact with ggml: every value is computed with the same float operations in the same order,
// e.g. Q4_K is (d * scale) * q - (dmin * min). The products are exact (an fp16 has 11 significant
// bits, scale times code at most 12 more: 24 fit in a float), so only the last operation rounds,
// and fusing it into an FMA (which -march=native builds may do) changes nothing.
#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/dequant.h"
#include "core/quant/kquants_scales.h"

namespace lode::quant {

// Q2_K: 16 sub-blocks of 16 values; 2-bit codes; each sub-block byte holds a 4-bit scale (low
// nibble) and a 4-bit min (high nibble). Four codes share a byte of qs: byte l of a 32-byte group
// holds values l, l + 32, l + 64, l + 96 of that group's 128 values (two bits each, low first).
void dequantize_row_q2_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ2_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockQ2_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d), dmin = fp16_to_fp32(block.dmin);
    float* y = dst + b * QK_K;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* qs = block.qs + 32 * half;
      for (int sub = 8 * half; sub < 8 * half + 8; ++sub) {  // 16 values each
        const int shift = 2 * ((sub % 8) / 2), first = 16 * (sub % 2);
        const uint8_t packed = block.scales[sub];
        const float dl = d * float(packed & 0x0f), ml = dmin * float(packed >> 4);
        for (int l = first; l < first + 16; ++l) *y++ = dl * float((qs[l] >> shift) & 3) - ml;
      }
    }
  }
}

// Q3_K: 16 sub-blocks of 16 values; 3-bit codes = 2 low bits laid out like Q2_K plus a high bit
// in hmask (value i of the block: byte i % 32, bit i / 32). A clear high bit means "minus 4".
void dequantize_row_q3_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ3_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockQ3_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    float* y = dst + b * QK_K;
    for (int group = 0; group < 8; ++group) {  // 32 values each
      const uint8_t* qs = block.qs + 32 * (group / 4);
      const int shift = 2 * (group % 4);
      const uint8_t high_bit = uint8_t(1u << group);
      for (int half = 0; half < 2; ++half) {
        const float dl = d * float(unpack_scale_q3_k(block.scales, 2 * group + half));
        for (int l = 16 * half; l < 16 * half + 16; ++l) {
          const int q = ((qs[l] >> shift) & 3) - ((block.hmask[l] & high_bit) ? 0 : 4);
          *y++ = dl * float(q);
        }
      }
    }
  }
}

// Q4_K: 8 sub-blocks of 32 values; 4-bit codes; 6-bit scale and min per sub-block. Each 32-byte
// group of qs holds two sub-blocks: the low nibbles the first, the high nibbles the second.
void dequantize_row_q4_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockQ4_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d), dmin = fp16_to_fp32(block.dmin);
    float* y = dst + b * QK_K;
    for (int sub = 0; sub < 8; ++sub) {
      const ScaleMin sm = unpack_scale_min_k4(block.scales, sub);
      const float dl = d * float(sm.scale), ml = dmin * float(sm.min);
      const uint8_t* qs = block.qs + 32 * (sub / 2);
      const int shift = 4 * (sub % 2);
      for (int l = 0; l < 32; ++l) *y++ = dl * float((qs[l] >> shift) & 0x0f) - ml;
    }
  }
}

// Q5_K: Q4_K plus a fifth bit per value in qh (sub-block s: byte l, bit s) worth 16.
void dequantize_row_q5_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockQ5_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d), dmin = fp16_to_fp32(block.dmin);
    float* y = dst + b * QK_K;
    for (int sub = 0; sub < 8; ++sub) {
      const ScaleMin sm = unpack_scale_min_k4(block.scales, sub);
      const float dl = d * float(sm.scale), ml = dmin * float(sm.min);
      const uint8_t* qs = block.qs + 32 * (sub / 2);
      const int shift = 4 * (sub % 2);
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[l] >> shift) & 0x0f) | (((block.qh[l] >> sub) & 1) << 4);
        *y++ = dl * float(q) - ml;
      }
    }
  }
}

// Q6_K: 16 sub-blocks of 16 values; 6-bit codes (minus 32) with a signed 8-bit scale each. Per
// 128-value half: ql holds the low nibbles of values l and l + 64 (byte l) and l + 32, l + 96
// (byte l + 32); qh byte l holds the top two bits of values l, l + 32, l + 64, l + 96.
void dequantize_row_q6_K(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockQ6_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    float* y = dst + b * QK_K;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = block.ql + 64 * half;
      const uint8_t* qh = block.qh + 32 * half;
      for (int quarter = 0; quarter < 4; ++quarter) {  // 32 values each
        const uint8_t* low = ql + 32 * (quarter % 2);
        const int low_shift = 4 * (quarter / 2), high_shift = 2 * quarter;
        for (int l = 0; l < 32; ++l) {
          const int sub = 8 * half + 2 * quarter + l / 16;
          const int q = (((low[l] >> low_shift) & 0x0f) | (((qh[l] >> high_shift) & 3) << 4)) - 32;
          *y++ = d * float(block.scales[sub]) * float(q);
        }
      }
    }
  }
}

}  // namespace lode::quant
