// IEEE half (fp16) and bfloat16 conversions, bit-exact with ggml's reference conversions:
// fp32 -> fp16 and fp32 -> bf16 round to nearest, ties to even; NaN stays NaN (quiet).
// fp16 -> fp32 is exact.
#pragma once
#include <bit>
#include <cstdint>

namespace lode {

// Exact for every number; NaNs come out quiet (bit 22 set), as ggml's conversion gives them.
// The cases are told apart with carries into bit 15 instead of branches, so row loops vectorize.
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t magnitude = h & 0x7fff;
  const uint32_t is_special = (magnitude + 0x0400) >> 15;  // exponent all ones: infinity or NaN
  const uint32_t is_nan = (magnitude + 0x03ff) >> 15;      // ... with a nonzero mantissa
  const uint32_t is_normal = (magnitude + 0x7c00) >> 15;   // exponent not zero
  // Normal numbers: move exponent and mantissa into place and rebias the exponent (15 -> 127);
  // the special ones get another +112 to reach exponent 255.
  const uint32_t wide = ((magnitude << 13) + 0x38000000u + is_special * 0x38000000u) | is_nan << 22;
  // Zero and subnormals: mantissa * 2^-24, exact in fp32.
  const uint32_t tiny = std::bit_cast<uint32_t>(float(int32_t(magnitude)) * (1.0f / 16777216.0f));
  const uint32_t normal_mask = 0u - is_normal;
  return std::bit_cast<float>(sign | (wide & normal_mask) | (tiny & ~normal_mask));
}

inline uint16_t fp32_to_fp16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  x &= 0x7fffffff;
  if (x > 0x7f800000) return sign | 0x7e00;   // NaN
  if (x >= 0x477ff000) return sign | 0x7c00;  // >= 65520 rounds to infinity
  if (x < 0x38800000) {                       // below 2^-14: fp16 subnormal (or zero)
    if (x <= 0x33000000) return sign;         // <= 2^-25 rounds to zero (the tie goes to even 0)
    const uint32_t mantissa = (x & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - (x >> 23);   // value / 2^-24 = mantissa >> shift
    uint32_t q = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1))) ++q;
    return sign | uint16_t(q);
  }
  uint32_t h = (((x >> 23) - 112) << 10) | ((x & 0x7fffff) >> 13);
  const uint32_t rest = x & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // a carry may step the exponent: fine
  return sign | uint16_t(h);
}

inline float bf16_to_fp32(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint16_t fp32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffff) > 0x7f800000) return uint16_t((x >> 16) | 0x40);  // quiet the NaN
  return uint16_t((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

}  // namespace lode
