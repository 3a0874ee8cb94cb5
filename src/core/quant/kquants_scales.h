// Packed sub-block scales of the k-quants, shared by the dequantizers, the quantizers and tests.
//
// Q4_K / Q5_K: eight 6-bit (scale, min) pairs in 12 bytes. Pairs 0-3 sit whole in the low six bits
// of bytes 0-3 (scales) and 4-7 (mins). Pairs 4-7 keep their low four bits as the two nibbles of
// bytes 8-11 (scale low, min high) and their top two bits in the spare top bits of bytes 0-3
// (scales) and 4-7 (mins).
//
// Q3_K: sixteen 6-bit scales stored with a bias of 32, in 12 bytes. Scale j keeps its low four bits
// in byte j % 8 (low nibble for j < 8, high nibble otherwise) and its top two bits in byte
// 8 + j % 4, at bit 2 * (j / 4).
#pragma once
#include <cstdint>

namespace lode::quant {

struct ScaleMin {
  uint8_t scale;  // 0..63
  uint8_t min;    // 0..63
};

inline ScaleMin unpack_scale_min_k4(const uint8_t* packed, int j) {
  if (j < 4) return {uint8_t(packed[j] & 63), uint8_t(packed[j + 4] & 63)};
  const uint8_t low = packed[j + 4];
  return {uint8_t((low & 0x0f) | ((packed[j - 4] >> 6) << 4)),
          uint8_t((low >> 4) | ((packed[j] >> 6) << 4))};
}

// scales[j], mins[j] must be 0..63.
inline void pack_scales_mins_k4(const uint8_t* scales, const uint8_t* mins, uint8_t* packed) {
  for (int j = 0; j < 4; ++j) {
    packed[j] = uint8_t(scales[j] | ((scales[j + 4] >> 4) << 6));
    packed[j + 4] = uint8_t(mins[j] | ((mins[j + 4] >> 4) << 6));
    packed[j + 8] = uint8_t((scales[j + 4] & 0x0f) | ((mins[j + 4] & 0x0f) << 4));
  }
}

// The signed scale (-32..31) of sub-block j of a Q3_K block.
inline int unpack_scale_q3_k(const uint8_t* packed, int j) {
  const int low = (packed[j % 8] >> (4 * (j / 8))) & 0x0f;
  const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// scales[j] must be -32..31.
inline void pack_scales_q3_k(const int8_t* scales, uint8_t* packed) {
  for (int i = 0; i < 12; ++i) packed[i] = 0;
  for (int j = 0; j < 16; ++j) {
    const int biased = scales[j] + 32;
    packed[j % 8] |= uint8_t((biased & 0x0f) << (4 * (j / 8)));
    packed[8 + j % 4] |= uint8_t((biased >> 4) << (2 * (j / 4)));
  }
}

}  // namespace lode::quant
