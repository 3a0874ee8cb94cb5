// IEEE half (fp16) and bfloat16 conversions, bit-exact with ggml's reference conversions:
// fp32 -> fp16 and fp32 -> bf16 round to nearest, ties to even; NaN stays NaN (quiet).
#pragma once
#include <bit>
#include <cstdint>

namespace lode {

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000 | (mantissa << 13));
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // zero or subnormal: mantissa * 2^-24, exact in fp32
  const float magnitude = float(mantissa) * (1.0f / 16777216.0f);
  return sign ? -magnitude : magnitude;
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
