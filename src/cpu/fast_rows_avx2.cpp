// AVX2 row decoders (cpu/fast_rows.h) for the types whose portable loops the compiler vectorizes
// poorly: q6_K (the lm head and embeddings of most quants; 1 ns a value portable, its variable
// shifts unvectorized), q4_K and q5_K (the experts of most quants), q8_0 and q5_0. (f16 rows take
// F16C in core/quant itself.)
//
// Why the bits agree. The 6- and 5-bit codes are assembled in integer lanes, exactly. Each value is
// then the reference's float operations on the same operands: float(code) times the scale (q4_K and
// q5_K: less the minimum), where the scale and minimum (d * float(scale)) are computed as scalars
// as the reference does; a small
// integer converts exactly and a multiply rounds once (no FMA: the target is avx2 and f16c only and
// the build passes -ffp-contract=off).
#include "cpu/fast_rows_avx2.h"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/kquants_scales.h"

#define LODE_AVX2 __attribute__((target("avx2,f16c")))
#define LODE_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

namespace lode::cpu::avx2 {
namespace {

using namespace lode::quant;

// 16 signed codes (a 128-bit lane) times `scale`, into 16 floats.
LODE_AVX2_INLINE void scale_sixteen(__m128i codes, float scale, float* dst) {
  const __m256 s = _mm256_set1_ps(scale);
  _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), s));
  _mm256_storeu_ps(dst + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(codes, 8))), s));
}

// 32 unsigned codes times dl, less ml: value = dl * float(q) - ml, the k-quant rule.
LODE_AVX2_INLINE void scale_thirty_two_less(__m256i codes, float dl, float ml, float* dst) {
  const __m256 s = _mm256_set1_ps(dl), m = _mm256_set1_ps(ml);
  const __m128i halves[2] = {_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1)};
  for (int h = 0; h < 2; ++h)
    for (int e = 0; e < 2; ++e) {
      const __m128i eight = e ? _mm_srli_si128(halves[h], 8) : halves[h];
      const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eight));
      _mm256_storeu_ps(dst + 16 * h + 8 * e, _mm256_sub_ps(_mm256_mul_ps(s, q), m));
    }
}

// q4_K and q5_K: eight subblocks of 32 values; subblocks 2j and 2j + 1 are the low and high
// nibbles of qs bytes 32j.., with (q5_K) bit `sub` of the 32 qh bytes as bit 4.
template <bool kFifthBit, class Block>
LODE_AVX2_INLINE void k45_row(const Block* blocks, float* dst, int64_t n) {
  const __m256i nibble = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(0x01);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const Block& block = blocks[b];
    const float d = fp16_to_fp32(block.d), dmin = fp16_to_fp32(block.dmin);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFifthBit) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qh));
    for (int pair = 0; pair < 4; ++pair) {
      const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qs + 32 * pair));
      for (int odd = 0; odd < 2; ++odd, dst += 32) {
        const int sub = 2 * pair + odd;
        __m256i codes = _mm256_and_si256(odd ? _mm256_srli_epi16(qs, 4) : qs, nibble);
        if constexpr (kFifthBit) {
          const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(sub)), one);
          codes = _mm256_or_si256(codes, _mm256_slli_epi16(bit, 4));
        }
        const ScaleMin sm = unpack_scale_min_k4(block.scales, sub);
        scale_thirty_two_less(codes, d * float(sm.scale), dmin * float(sm.min), dst);
      }
    }
  }
}

LODE_AVX2 void q4_K_row(const void* src, float* dst, int64_t n) {
  k45_row<false>(static_cast<const BlockQ4_K*>(src), dst, n);
}
LODE_AVX2 void q5_K_row(const void* src, float* dst, int64_t n) {
  k45_row<true>(static_cast<const BlockQ5_K*>(src), dst, n);
}

// A q6_K quarter's 32 codes (less 32): the low nibbles `low` (shifted down by low_shift) with bits
// high_shift, high_shift + 1 of `high` on top. 16-bit shifts move bits across bytes; the masks
// drop them.
LODE_AVX2_INLINE __m256i q6_codes(__m256i low, int low_shift, __m256i high, int high_shift) {
  const __m256i nibble = _mm256_set1_epi8(0x0f), two_bits = _mm256_set1_epi8(0x03);
  const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(low, low_shift), nibble);
  const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, high_shift), two_bits), 4);
  return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
}

// q6_K: a half of a block is 128 values in four quarters of 32; quarter q takes the low nibbles of
// ql bytes 32 * (q % 2) .. (shifted by 4 for q >= 2) and bits 2q, 2q + 1 of the 32 qh bytes; each
// 16 values have their own scale.
LODE_AVX2 void q6_K_row(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockQ6_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    for (int half = 0; half < 2; ++half, dst += 128) {
      const uint8_t* ql = block.ql + 64 * half;
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qh + 32 * half));
      const __m256i quarters[4] = {q6_codes(l0, 0, h, 0), q6_codes(l1, 0, h, 2), q6_codes(l0, 4, h, 4),
                                   q6_codes(l1, 4, h, 6)};
      const int8_t* scales = block.scales + 8 * half;
      for (int q = 0; q < 4; ++q) {
        scale_sixteen(_mm256_castsi256_si128(quarters[q]), d * float(scales[2 * q]), dst + 32 * q);
        scale_sixteen(_mm256_extracti128_si256(quarters[q], 1), d * float(scales[2 * q + 1]), dst + 32 * q + 16);
      }
    }
  }
}

// q5_0: value i is the low nibble of qs[i] (i < 16) or the high one of qs[i - 16], with bit i of
// qh as its bit 4, less 16, times d. Byte j of the spread holds qh byte j / 8; the mask keeps bit
// j % 8 of it.
LODE_AVX2 void q5_0_row(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_0*>(src);
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit_of_lane = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  const __m128i nibble = _mm_set1_epi8(0x0f);
  for (int64_t b = 0; b < n / QK5_0; ++b, dst += QK5_0) {
    const BlockQ5_0& block = blocks[b];
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block.qs));
    const __m256i low = _mm256_setr_m128i(_mm_and_si128(qs, nibble), _mm_and_si128(_mm_srli_epi16(qs, 4), nibble));
    int32_t qh;
    std::memcpy(&qh, block.qh, sizeof qh);
    const __m256i bits = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread), bit_of_lane);
    const __m256i bit4 = _mm256_and_si256(_mm256_cmpeq_epi8(bits, bit_of_lane), _mm256_set1_epi8(0x10));
    const __m256i codes = _mm256_sub_epi8(_mm256_or_si256(low, bit4), _mm256_set1_epi8(16));
    const float d = fp16_to_fp32(block.d);
    scale_sixteen(_mm256_castsi256_si128(codes), d, dst);
    scale_sixteen(_mm256_extracti128_si256(codes, 1), d, dst + 16);
  }
}

LODE_AVX2 void q8_0_row(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / QK8_0; ++b, dst += QK8_0) {
    const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks[b].qs));
    const float d = fp16_to_fp32(blocks[b].d);
    scale_sixteen(_mm256_castsi256_si128(codes), d, dst);
    scale_sixteen(_mm256_extracti128_si256(codes, 1), d, dst + 16);
  }
}

}  // namespace

DequantizeRow row_decoder(GgmlType type) {
  switch (type) {
    case GgmlType::Q8_0: return q8_0_row;
    case GgmlType::Q4_K: return q4_K_row;
    case GgmlType::Q5_K: return q5_K_row;
    case GgmlType::Q6_K: return q6_K_row;
    case GgmlType::Q5_0: return q5_0_row;
    default: return nullptr;
  }
}

}  // namespace lode::cpu::avx2
