// Unit tests of the float formats and the 32-value block formats: block layout, the exact float
// operations of the dequantizers, and the rules of the q4_0 / q4_1 / q5_0 / q5_1 / q8_0 reference
// quantizers (how the scale is picked, how codes round and clamp). Expected values are worked out by hand from the
// format; the golden test (test_quant_golden.cpp) checks the same code against ggml's own outputs.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/dequant.h"

using namespace lode;
using namespace lode::quant;

namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// Nibble-packs 32 codes the way every 32-value format stores them.
void pack_nibbles(const int codes[32], uint8_t qs[16]) {
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t((codes[j] & 0x0f) | (codes[j + 16] & 0x0f) << 4);
}

void unpack_nibbles(const uint8_t qs[16], int codes[32]) {
  for (int j = 0; j < 16; ++j) {
    codes[j] = qs[j] & 0x0f;
    codes[j + 16] = qs[j] >> 4;
  }
}

BlockQ4_0 quantize_q4_0(const std::vector<float>& block) {
  BlockQ4_0 out;
  quantize_row_q4_0(block.data(), &out, 32);
  return out;
}

BlockQ8_0 quantize_q8_0(const std::vector<float>& block) {
  BlockQ8_0 out;
  quantize_row_q8_0(block.data(), &out, 32);
  return out;
}

template <class Block, void (*quantize)(const float*, void*, int64_t)>
Block quantize_one(const std::vector<float>& block) {
  Block out;
  quantize(block.data(), &out, 32);
  return out;
}
const auto quantize_q4_1 = quantize_one<BlockQ4_1, quantize_row_q4_1>;
const auto quantize_q5_0 = quantize_one<BlockQ5_0, quantize_row_q5_0>;
const auto quantize_q5_1 = quantize_one<BlockQ5_1, quantize_row_q5_1>;

// The 5-bit codes of a q5_0 / q5_1 block: the nibble plus bit i of qh as bit 4.
void unpack_5bit(const uint8_t qs[16], const uint8_t qh[4], int codes[32]) {
  unpack_nibbles(qs, codes);
  for (int i = 0; i < 32; ++i) codes[i] |= (qh[i / 8] >> (i % 8) & 1) << 4;
}

}  // namespace

// --- float formats ------------------------------------------------------------------------------

TEST(QuantFloat, F32IsACopyBitForBit) {
  const float in[4] = {1.5f, -0.0f, std::bit_cast<float>(0x7fa00001u), 1e-45f};
  float stored[4], out[4];
  quantize_row_f32(in, stored, 4);
  dequantize_row_f32(stored, out, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bits(out[i]), bits(in[i])) << i;
}

TEST(QuantFloat, F16RowsRoundToNearestEven) {
  const float in[4] = {1.0f, 1.0f + std::ldexp(1.0f, -11), -65504.0f, 1e6f};
  uint16_t half[4];
  quantize_row_f16(in, half, 4);
  EXPECT_EQ(half[0], 0x3c00);
  EXPECT_EQ(half[1], 0x3c00);  // tie -> even
  EXPECT_EQ(half[2], 0xfbff);
  EXPECT_EQ(half[3], 0x7c00);  // overflow -> infinity
  float out[4];
  dequantize_row_f16(half, out, 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[2], -65504.0f);
  EXPECT_TRUE(std::isinf(out[3]));
}

TEST(QuantFloat, F16SignallingNaNComesBackQuietLikeGgml) {
  const uint16_t half[3] = {0x7c01, 0xfe00, 0x7c00};
  float out[3];
  dequantize_row_f16(half, out, 3);
  EXPECT_EQ(bits(out[0]), 0x7fc02000u);  // payload kept, quiet bit set
  EXPECT_EQ(bits(out[1]), 0xffc00000u);  // already quiet: unchanged
  EXPECT_EQ(bits(out[2]), 0x7f800000u);  // infinity is not a NaN
}

TEST(QuantFloat, F16WidensEveryHalfExactly) {
  std::vector<uint16_t> half(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) half[h] = uint16_t(h);
  std::vector<float> out(half.size());
  dequantize_row_f16(half.data(), out.data(), int64_t(half.size()));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint32_t expected = bits(fp16_to_fp32(uint16_t(h)));
    if (std::isnan(fp16_to_fp32(uint16_t(h)))) expected |= 0x00400000u;  // quiet, like ggml
    ASSERT_EQ(bits(out[h]), expected) << std::hex << h;
  }
}

TEST(QuantFloat, Bf16RowsRoundToNearestEvenAndWidenExactly) {
  const float in[3] = {std::bit_cast<float>(0x3f808000u), std::bit_cast<float>(0x3f818000u), -2.0f};
  uint16_t brain[3];
  quantize_row_bf16(in, brain, 3);
  EXPECT_EQ(brain[0], 0x3f80);
  EXPECT_EQ(brain[1], 0x3f82);
  EXPECT_EQ(brain[2], 0xc000);
  float out[3];
  dequantize_row_bf16(brain, out, 3);
  EXPECT_EQ(bits(out[0]), 0x3f800000u);
  EXPECT_EQ(bits(out[1]), 0x3f820000u);
  EXPECT_EQ(out[2], -2.0f);
}

// --- dequantizers -------------------------------------------------------------------------------

TEST(QuantLegacy, Q4_0DequantizesCodeMinusEightTimesD) {
  BlockQ4_0 block;
  block.d = fp32_to_fp16(0.5f);
  int codes[32];
  for (int i = 0; i < 32; ++i) codes[i] = (i * 7) % 16;
  pack_nibbles(codes, block.qs);
  float out[32];
  dequantize_row_q4_0(&block, out, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], float(codes[i] - 8) * 0.5f) << i;
}

TEST(QuantLegacy, Q4_1DequantizesCodeTimesDPlusMin) {
  BlockQ4_1 block;
  block.d = fp32_to_fp16(0.25f);
  block.m = fp32_to_fp16(-1.75f);
  int codes[32];
  for (int i = 0; i < 32; ++i) codes[i] = (i * 5 + 3) % 16;
  pack_nibbles(codes, block.qs);
  float out[32];
  dequantize_row_q4_1(&block, out, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], float(codes[i]) * 0.25f - 1.75f) << i;
}

TEST(QuantLegacy, Q5_0TakesBitFourOfValueIFromBitIOfQh) {
  BlockQ5_0 block;
  block.d = fp32_to_fp16(2.0f);
  std::memset(block.qs, 0x00, sizeof block.qs);
  const uint32_t qh = (1u << 0) | (1u << 15) | (1u << 16) | (1u << 31);
  for (int k = 0; k < 4; ++k) block.qh[k] = uint8_t(qh >> (8 * k));
  float out[32];
  dequantize_row_q5_0(&block, out, 32);
  for (int i = 0; i < 32; ++i) {
    const int code = ((qh >> i) & 1) ? 16 : 0;
    EXPECT_EQ(out[i], float(code - 16) * 2.0f) << i;
  }
}

TEST(QuantLegacy, Q5_1CombinesNibblesAndHighBits) {
  BlockQ5_1 block;
  block.d = fp32_to_fp16(0.125f);
  block.m = fp32_to_fp16(3.0f);
  int low[32];
  for (int i = 0; i < 32; ++i) low[i] = (i * 3) % 16;
  pack_nibbles(low, block.qs);
  const uint32_t qh = 0xa5c3'0f96u;
  for (int k = 0; k < 4; ++k) block.qh[k] = uint8_t(qh >> (8 * k));
  float out[32];
  dequantize_row_q5_1(&block, out, 32);
  for (int i = 0; i < 32; ++i) {
    const int code = low[i] | int((qh >> i) & 1) << 4;
    EXPECT_EQ(out[i], float(code) * 0.125f + 3.0f) << i;
  }
}

TEST(QuantLegacy, Q8_0DequantizesSignedCodes) {
  BlockQ8_0 block;
  block.d = fp32_to_fp16(-0.5f);
  for (int i = 0; i < 32; ++i) block.qs[i] = int8_t(i * 8 - 128);
  float out[32];
  dequantize_row_q8_0(&block, out, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], float(i * 8 - 128) * -0.5f) << i;
}

TEST(QuantLegacy, DequantizersWalkEveryBlockOfARow) {
  BlockQ8_0 blocks[3];
  for (int b = 0; b < 3; ++b) {
    blocks[b].d = fp32_to_fp16(float(b + 1));
    for (int i = 0; i < 32; ++i) blocks[b].qs[i] = int8_t(i);
  }
  float out[96];
  dequantize_row_q8_0(blocks, out, 96);
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < 32; ++i) EXPECT_EQ(out[b * 32 + i], float(i * (b + 1)));
}

// --- q4_0 quantizer -----------------------------------------------------------------------------

TEST(QuantLegacy, Q4_0OfZerosIsZeroScaleAndMiddleCodes) {
  const BlockQ4_0 block = quantize_q4_0(std::vector<float>(32, 0.0f));
  EXPECT_EQ(block.d, 0x8000);  // d = 0 / -8 is negative zero
  for (int j = 0; j < 16; ++j) EXPECT_EQ(block.qs[j], 0x88) << j;
}

TEST(QuantLegacy, Q4_0ScaleKeepsTheSignOfTheLargestMagnitude) {
  std::vector<float> x(32, 0.0f);
  x[3] = -4.0f;
  x[20] = 4.0f - 0.5f;
  const BlockQ4_0 negative = quantize_q4_0(x);
  EXPECT_EQ(negative.d, fp32_to_fp16(0.5f));  // d = max / -8 = -4 / -8
  int codes[32];
  unpack_nibbles(negative.qs, codes);
  EXPECT_EQ(codes[3], 0);    // the max itself maps to -8
  EXPECT_EQ(codes[20], 15);  // 3.5 * 2 + 8.5 = 15.5 -> 15
  EXPECT_EQ(codes[0], 8);

  for (float& v : x) v = -v;
  const BlockQ4_0 positive = quantize_q4_0(x);
  EXPECT_EQ(positive.d, fp32_to_fp16(-0.5f));
  unpack_nibbles(positive.qs, codes);
  EXPECT_EQ(codes[3], 0);
  EXPECT_EQ(codes[20], 15);
}

TEST(QuantLegacy, Q4_0FirstOfEqualMagnitudesWinsAndTheOtherClampsTo15) {
  std::vector<float> x(32, 0.0f);
  x[5] = -2.0f;
  x[9] = 2.0f;
  BlockQ4_0 block = quantize_q4_0(x);
  EXPECT_EQ(block.d, fp32_to_fp16(0.25f));
  int codes[32];
  unpack_nibbles(block.qs, codes);
  EXPECT_EQ(codes[5], 0);
  EXPECT_EQ(codes[9], 15);  // 2 * 4 + 8.5 = 16.5 -> 16, clamped

  std::swap(x[5], x[9]);  // now +2 comes first
  block = quantize_q4_0(x);
  EXPECT_EQ(block.d, fp32_to_fp16(-0.25f));
  unpack_nibbles(block.qs, codes);
  EXPECT_EQ(codes[5], 0);
  EXPECT_EQ(codes[9], 15);
}

TEST(QuantLegacy, Q4_0RoundsHalfUpNotAwayFromZero) {
  // max -8 gives d = 1: codes are floor(x + 8.5), so -0.5 -> 8 and -1.5 -> 7 (round-half-away
  // would give 7 and 6), while 0.5 -> 9 and 1.5 -> 10.
  std::vector<float> x(32, 0.0f);
  x[0] = -8.0f;
  x[1] = -0.5f;
  x[2] = -1.5f;
  x[17] = 0.5f;
  x[18] = 1.5f;
  x[19] = 0.49f;
  const BlockQ4_0 block = quantize_q4_0(x);
  EXPECT_EQ(block.d, 0x3c00);
  int codes[32];
  unpack_nibbles(block.qs, codes);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 8);
  EXPECT_EQ(codes[2], 7);
  EXPECT_EQ(codes[17], 9);
  EXPECT_EQ(codes[18], 10);
  EXPECT_EQ(codes[19], 8);
}

TEST(QuantLegacy, Q4_0CodesUseTheUnroundedScale) {
  // d = 1 + 2^-12 is stored as fp16 1.0, but 0.5 / (1 + 2^-12) + 8.5 falls just below 9.
  std::vector<float> x(32, 0.0f);
  x[0] = -8.0f * (1.0f + std::ldexp(1.0f, -12));
  x[1] = 0.5f;
  const BlockQ4_0 block = quantize_q4_0(x);
  EXPECT_EQ(block.d, 0x3c00);
  int codes[32];
  unpack_nibbles(block.qs, codes);
  EXPECT_EQ(codes[1], 8);
}

TEST(QuantLegacy, Q4_0TinyScaleWhoseInverseOverflowsGivesCodeZero) {
  // |max| below 2^-125: d is nonzero but 1/d is infinite, so x * (1/d) is +-inf or NaN, which
  // ggml's cast turns into code 0.
  std::vector<float> x(32, 0.0f);
  x[0] = -std::ldexp(1.0f, -127);
  x[1] = std::ldexp(1.0f, -128);
  const BlockQ4_0 block = quantize_q4_0(x);
  EXPECT_EQ(block.d, 0);  // far below fp16's smallest subnormal
  for (int j = 0; j < 16; ++j) EXPECT_EQ(block.qs[j], 0x00) << j;
}

TEST(QuantLegacy, Q4_0RoundTripErrorIsWithinOneStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(32 * 64);
  for (float& v : x) v = normal(rng);
  std::vector<BlockQ4_0> blocks(64);
  quantize_row_q4_0(x.data(), blocks.data(), int64_t(x.size()));
  std::vector<float> y(x.size());
  dequantize_row_q4_0(blocks.data(), y.data(), int64_t(y.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float d = std::fabs(fp16_to_fp32(blocks[i / 32].d));
    EXPECT_LE(std::fabs(x[i] - y[i]), 1.01f * d) << i;
  }
}

// --- q8_0 quantizer -----------------------------------------------------------------------------

TEST(QuantLegacy, Q8_0OfZerosIsAllZero) {
  const BlockQ8_0 block = quantize_q8_0(std::vector<float>(32, 0.0f));
  EXPECT_EQ(block.d, 0);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(block.qs[j], 0) << j;
}

TEST(QuantLegacy, Q8_0RoundsHalfAwayFromZero) {
  std::vector<float> x(32, 0.0f);
  x[0] = -127.0f;  // d = 1
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.5f;
  x[4] = -0.5f;
  x[5] = 126.49f;
  const BlockQ8_0 block = quantize_q8_0(x);
  EXPECT_EQ(block.d, 0x3c00);
  EXPECT_EQ(block.qs[0], -127);
  EXPECT_EQ(block.qs[1], 3);
  EXPECT_EQ(block.qs[2], -3);
  EXPECT_EQ(block.qs[3], 1);
  EXPECT_EQ(block.qs[4], -1);
  EXPECT_EQ(block.qs[5], 126);
}

TEST(QuantLegacy, Q8_0ScaleIsAmaxOver127RoundedToFp16) {
  std::vector<float> x(32, 0.0f);
  x[7] = 1.0f;
  x[8] = -0.75f;
  const BlockQ8_0 block = quantize_q8_0(x);
  EXPECT_EQ(block.d, fp32_to_fp16(1.0f / 127.0f));
  EXPECT_EQ(block.qs[7], 127);
  EXPECT_EQ(block.qs[8], -95);  // -95.25
}

TEST(QuantLegacy, Q8_0NaNCountsForTheScaleOnlyWhenLast) {
  // ggml's running max (amax > |v| ? amax : |v|) takes a NaN in, and lets the next value out.
  std::vector<float> x(32, 1.0f);
  x[4] = NAN;
  BlockQ8_0 block = quantize_q8_0(x);
  EXPECT_EQ(block.d, fp32_to_fp16(1.0f / 127.0f));
  EXPECT_EQ(block.qs[4], 0);
  EXPECT_EQ(block.qs[5], 127);

  x[4] = 1.0f;
  x[31] = NAN;
  block = quantize_q8_0(x);
  EXPECT_EQ(block.d & 0x7fff, 0x7e00);  // a NaN scale, as ggml stores it
  for (int j = 0; j < 32; ++j) EXPECT_EQ(block.qs[j], 0) << j;  // NaN codes become 0
}

TEST(QuantLegacy, Q8_0RoundTripErrorIsWithinHalfAStep) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(32 * 64);
  for (float& v : x) v = normal(rng);
  std::vector<BlockQ8_0> blocks(64);
  quantize_row_q8_0(x.data(), blocks.data(), int64_t(x.size()));
  std::vector<float> y(x.size());
  dequantize_row_q8_0(blocks.data(), y.data(), int64_t(y.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float d = fp16_to_fp32(blocks[i / 32].d);
    EXPECT_LE(std::fabs(x[i] - y[i]), 0.6f * d) << i;  // half a step, plus d's fp16 rounding
  }
}

// --- q4_1 quantizer -----------------------------------------------------------------------------

TEST(QuantLegacy, Q4_1SpansMinToMaxInFifteenSteps) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = -2.0f + float((i * 7) % 16) * 0.5f;  // min -2, max 5.5
  const BlockQ4_1 block = quantize_q4_1(x);
  EXPECT_EQ(block.d, fp32_to_fp16(0.5f));  // (5.5 - -2) / 15
  EXPECT_EQ(block.m, fp32_to_fp16(-2.0f));
  int codes[32];
  unpack_nibbles(block.qs, codes);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(codes[i], (i * 7) % 16) << i;
}

TEST(QuantLegacy, Q4_1RoundsHalfUp) {
  std::vector<float> x(32, 0.0f);
  x[0] = 15.0f;  // min 0, d = 1
  x[1] = 2.5f;
  x[2] = 2.49f;
  x[3] = 0.5f;
  x[17] = 14.5f;
  const BlockQ4_1 block = quantize_q4_1(x);
  EXPECT_EQ(block.d, 0x3c00);
  EXPECT_EQ(block.m, 0x0000);
  int codes[32];
  unpack_nibbles(block.qs, codes);
  EXPECT_EQ(codes[0], 15);
  EXPECT_EQ(codes[1], 3);
  EXPECT_EQ(codes[2], 2);
  EXPECT_EQ(codes[3], 1);
  EXPECT_EQ(codes[17], 15);
  EXPECT_EQ(codes[4], 0);
}

TEST(QuantLegacy, Q4_1ConstantBlockIsZeroScaleMinAndCodeZero) {
  const BlockQ4_1 block = quantize_q4_1(std::vector<float>(32, 3.0f));
  EXPECT_EQ(block.d, 0);
  EXPECT_EQ(block.m, fp32_to_fp16(3.0f));
  for (int j = 0; j < 16; ++j) EXPECT_EQ(block.qs[j], 0) << j;
}

TEST(QuantLegacy, Q4_1CodesUseTheUnroundedMin) {
  // min = 1 + 2^-12 is stored as fp16 1.0, but the codes measure from the float min: 1.5 sits
  // just below half a step above it, so it rounds down to 0 (it would be 1 from the stored min).
  std::vector<float> x(32, 16.0f);
  x[0] = 1.0f + std::ldexp(1.0f, -12);
  x[1] = 1.5f;
  const BlockQ4_1 block = quantize_q4_1(x);
  EXPECT_EQ(block.m, 0x3c00);
  int codes[32];
  unpack_nibbles(block.qs, codes);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 15);
}

TEST(QuantLegacy, Q4_1NaNIsSkippedForTheRangeAndGetsCodeZero) {
  std::vector<float> x(32, 1.0f);
  x[0] = 16.0f;
  x[5] = NAN;
  const BlockQ4_1 block = quantize_q4_1(x);
  EXPECT_EQ(block.d, 0x3c00);  // (16 - 1) / 15
  EXPECT_EQ(block.m, 0x3c00);
  int codes[32];
  unpack_nibbles(block.qs, codes);
  EXPECT_EQ(codes[0], 15);
  EXPECT_EQ(codes[5], 0);
}

TEST(QuantLegacy, Q4_1RoundTripErrorIsWithinHalfAStep) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.5f, 2.0f);
  std::vector<float> x(32 * 64);
  for (float& v : x) v = normal(rng);
  std::vector<BlockQ4_1> blocks(64);
  quantize_row_q4_1(x.data(), blocks.data(), int64_t(x.size()));
  std::vector<float> y(x.size());
  dequantize_row_q4_1(blocks.data(), y.data(), int64_t(y.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float d = fp16_to_fp32(blocks[i / 32].d);
    EXPECT_LE(std::fabs(x[i] - y[i]), 0.6f * d) << i;  // half a step, plus fp16 rounding of d, m
  }
}

// --- q5_0 quantizer -----------------------------------------------------------------------------

TEST(QuantLegacy, Q5_0OfZerosIsZeroScaleAndMiddleCodes) {
  const BlockQ5_0 block = quantize_q5_0(std::vector<float>(32, 0.0f));
  EXPECT_EQ(block.d, 0x8000);  // d = 0 / -16 is negative zero
  for (int j = 0; j < 16; ++j) EXPECT_EQ(block.qs[j], 0x00) << j;  // code 16: nibble 0, high bit 1
  for (int k = 0; k < 4; ++k) EXPECT_EQ(block.qh[k], 0xff) << k;
}

TEST(QuantLegacy, Q5_0ScaleKeepsTheSignOfTheLargestMagnitude) {
  std::vector<float> x(32, 0.0f);
  x[3] = -8.0f;
  x[20] = 7.75f;
  x[21] = -0.25f;
  BlockQ5_0 block = quantize_q5_0(x);
  EXPECT_EQ(block.d, fp32_to_fp16(0.5f));  // d = -8 / -16
  int codes[32];
  unpack_5bit(block.qs, block.qh, codes);
  EXPECT_EQ(codes[3], 0);    // the max itself maps to -16
  EXPECT_EQ(codes[20], 31);  // 7.75 * 2 + 16.5 = 32 -> clamped
  EXPECT_EQ(codes[21], 16);  // -0.5 + 16.5 = 16
  EXPECT_EQ(codes[0], 16);

  for (float& v : x) v = -v;
  block = quantize_q5_0(x);
  EXPECT_EQ(block.d, fp32_to_fp16(-0.5f));
  unpack_5bit(block.qs, block.qh, codes);
  EXPECT_EQ(codes[3], 0);
  EXPECT_EQ(codes[20], 31);
  EXPECT_EQ(codes[21], 16);
}

TEST(QuantLegacy, Q5_0RoundsHalfUpNotAwayFromZero) {
  std::vector<float> x(32, 0.0f);
  x[0] = -16.0f;  // d = 1
  x[1] = -0.5f;
  x[2] = -1.5f;
  x[9] = 0.5f;
  x[17] = 1.5f;
  x[30] = 15.49f;
  const BlockQ5_0 block = quantize_q5_0(x);
  EXPECT_EQ(block.d, 0x3c00);
  int codes[32];
  unpack_5bit(block.qs, block.qh, codes);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 16);
  EXPECT_EQ(codes[2], 15);
  EXPECT_EQ(codes[9], 17);
  EXPECT_EQ(codes[17], 18);
  EXPECT_EQ(codes[30], 31);
}

TEST(QuantLegacy, Q5_0TinyScaleWhoseInverseOverflowsGivesCodeZero) {
  std::vector<float> x(32, 0.0f);
  x[0] = -std::ldexp(1.0f, -127);
  x[1] = std::ldexp(1.0f, -128);
  const BlockQ5_0 block = quantize_q5_0(x);
  EXPECT_EQ(block.d, 0);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(block.qs[j], 0x00) << j;
  for (int k = 0; k < 4; ++k) EXPECT_EQ(block.qh[k], 0x00) << k;
}

TEST(QuantLegacy, Q5_0RoundTripErrorIsWithinOneStep) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(32 * 64);
  for (float& v : x) v = normal(rng);
  std::vector<BlockQ5_0> blocks(64);
  quantize_row_q5_0(x.data(), blocks.data(), int64_t(x.size()));
  std::vector<float> y(x.size());
  dequantize_row_q5_0(blocks.data(), y.data(), int64_t(y.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float d = std::fabs(fp16_to_fp32(blocks[i / 32].d));
    EXPECT_LE(std::fabs(x[i] - y[i]), 1.01f * d) << i;
  }
}

// --- q5_1 quantizer -----------------------------------------------------------------------------

TEST(QuantLegacy, Q5_1SpansMinToMaxInThirtyOneSteps) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = 1.0f + float((i * 5) % 32) * 0.25f;  // min 1, max 8.75
  const BlockQ5_1 block = quantize_q5_1(x);
  EXPECT_EQ(block.d, fp32_to_fp16(0.25f));  // 7.75 / 31
  EXPECT_EQ(block.m, fp32_to_fp16(1.0f));
  int codes[32];
  unpack_5bit(block.qs, block.qh, codes);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(codes[i], (i * 5) % 32) << i;
}

TEST(QuantLegacy, Q5_1RoundsHalfUp) {
  std::vector<float> x(32, 0.0f);
  x[0] = 31.0f;  // min 0, d = 1
  x[1] = 2.5f;
  x[2] = 2.49f;
  x[20] = 30.5f;
  x[21] = 15.5f;
  const BlockQ5_1 block = quantize_q5_1(x);
  EXPECT_EQ(block.d, 0x3c00);
  int codes[32];
  unpack_5bit(block.qs, block.qh, codes);
  EXPECT_EQ(codes[0], 31);
  EXPECT_EQ(codes[1], 3);
  EXPECT_EQ(codes[2], 2);
  EXPECT_EQ(codes[20], 31);
  EXPECT_EQ(codes[21], 16);
  EXPECT_EQ(codes[3], 0);
}

TEST(QuantLegacy, Q5_1ConstantBlockIsZeroScaleMinAndCodeZero) {
  const BlockQ5_1 block = quantize_q5_1(std::vector<float>(32, -0.75f));
  EXPECT_EQ(block.d, 0);
  EXPECT_EQ(block.m, fp32_to_fp16(-0.75f));
  for (int j = 0; j < 16; ++j) EXPECT_EQ(block.qs[j], 0) << j;
  for (int k = 0; k < 4; ++k) EXPECT_EQ(block.qh[k], 0) << k;
}

TEST(QuantLegacy, Q5_1BlockOfNaNsKeepsTheStartingRange) {
  // No value passes the strict compares, so min and max stay FLT_MAX and -FLT_MAX: d = -inf,
  // m = +inf in fp16, and every code (NaN) is 0 — what ggml writes.
  const BlockQ5_1 block = quantize_q5_1(std::vector<float>(32, NAN));
  EXPECT_EQ(block.d, 0xfc00);
  EXPECT_EQ(block.m, 0x7c00);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(block.qs[j], 0) << j;
  for (int k = 0; k < 4; ++k) EXPECT_EQ(block.qh[k], 0) << k;
}

TEST(QuantLegacy, Q5_1RoundTripErrorIsWithinHalfAStep) {
  std::mt19937 rng(19);
  std::normal_distribution<float> normal(-1.0f, 2.0f);
  std::vector<float> x(32 * 64);
  for (float& v : x) v = normal(rng);
  std::vector<BlockQ5_1> blocks(64);
  quantize_row_q5_1(x.data(), blocks.data(), int64_t(x.size()));
  std::vector<float> y(x.size());
  dequantize_row_q5_1(blocks.data(), y.data(), int64_t(y.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float d = fp16_to_fp32(blocks[i / 32].d);
    EXPECT_LE(std::fabs(x[i] - y[i]), 0.6f * d) << i;
  }
}
