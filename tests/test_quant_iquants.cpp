// The grid i-quants: the codebooks read out of ggml (iq_grids.cpp) and the dequantizers
// (iquants.cpp), on blocks built by hand whose values are worked out in the comments. The
// bit-exact comparison with ggml itself on random blocks is the golden test (test_quant_golden).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <random>
#include <set>
#include <vector>

#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/dequant.h"
#include "core/quant/iq_grids.h"

using namespace lode;
using namespace lode::quant;

namespace {

constexpr uint16_t kHalfOne = 0x3c00, kHalfTwo = 0x4000, kHalfHalf = 0x3800;

// Byte j of a grid entry, as an unsigned or a signed value.
int grid_byte(uint64_t entry, int j, bool is_signed = false) {
  const uint8_t byte = uint8_t(entry >> (8 * j));
  return is_signed ? int(int8_t(byte)) : int(byte);
}

template <typename Block>
std::vector<float> dequantize(void (*convert)(const void*, float*, int64_t), const Block& block) {
  std::vector<float> out(QK_K, NAN);
  convert(&block, out.data(), QK_K);
  return out;
}

void expect_values(const std::vector<float>& out, int first, std::initializer_list<float> expected) {
  int i = first;
  for (float value : expected) {
    EXPECT_EQ(out[i], value) << "value " << i;
    ++i;
  }
}

void expect_all(const std::vector<float>& out, int first, int count, float value) {
  for (int i = first; i < first + count; ++i) EXPECT_EQ(out[i], value) << "value " << i;
}

}  // namespace

TEST(IqGrids, Iq2GridsHoldOnlyTheirThreeMagnitudes) {
  const std::pair<const uint64_t*, int> grids[] = {{iq2xxs_grid, 256}, {iq2xs_grid, 512}, {iq2s_grid, 1024}};
  for (const auto& [grid, size] : grids) {
    std::set<uint64_t> distinct(grid, grid + size);
    EXPECT_EQ(distinct.size(), size_t(size));
    for (int i = 0; i < size; ++i)
      for (int j = 0; j < 8; ++j) {
        const int b = grid_byte(grid[i], j);
        EXPECT_TRUE(b == 8 || b == 25 || b == 43) << "entry " << i << " byte " << j << " = " << b;
      }
  }
}

TEST(IqGrids, Iq3GridsHoldTheirEightMagnitudes) {
  const std::set<int> xxs = {4, 12, 20, 28, 36, 44, 52, 62}, s = {1, 3, 5, 7, 9, 11, 13, 15};
  for (int i = 0; i < 256; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_TRUE(xxs.count(grid_byte(iq3xxs_grid[i], j))) << "iq3xxs " << i;
  for (int i = 0; i < 512; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_TRUE(s.count(grid_byte(iq3s_grid[i], j))) << "iq3s " << i;
  EXPECT_EQ(std::set<uint32_t>(iq3xxs_grid, iq3xxs_grid + 256).size(), 256u);
  EXPECT_EQ(std::set<uint32_t>(iq3s_grid, iq3s_grid + 512).size(), 512u);
}

TEST(IqGrids, Iq1GridHoldsMinusOneZeroOne) {
  EXPECT_EQ(std::set<uint64_t>(iq1s_grid, iq1s_grid + 2048).size(), 2048u);
  for (int i = 0; i < 2048; ++i)
    for (int j = 0; j < 8; ++j) {
      const int v = grid_byte(iq1s_grid[i], j, true);
      EXPECT_TRUE(v >= -1 && v <= 1) << "entry " << i << " byte " << j << " = " << v;
    }
}

TEST(IqGrids, SignPatternsKeepTheIndexAndHaveEvenParity) {
  for (int i = 0; i < 128; ++i) {
    EXPECT_EQ(ksigns_iq2xs[i] & 127, i);
    EXPECT_EQ(std::popcount(unsigned(ksigns_iq2xs[i])) % 2, 0) << "pattern " << i;
  }
}

// d = 1. Sub-block 0: grid indices 0, 1, 255, 0; sign indices 0, 1 (0x81), 127 (0xff), 0; scale
// nibble 3 = (3 + 1/2) / 4 = 0.875. Sub-blocks 1..7 are all zero: index 0 (all 8), scale 0.125.
TEST(IqDequantize, Iq2XxsHandBuiltBlock) {
  BlockIQ2_XXS block{};
  block.d = kHalfOne;
  const uint8_t indices[4] = {0, 1, 255, 0};
  const uint32_t signs_and_scale = 0u | 1u << 7 | 127u << 14 | 0u << 21 | 3u << 28;
  std::memcpy(block.qs, indices, 4);
  std::memcpy(reinterpret_cast<uint8_t*>(block.qs) + 4, &signs_and_scale, 4);
  const auto out = dequantize(dequantize_row_iq2_xxs, block);
  expect_all(out, 0, 8, 7.0f);                                              // 8 * 0.875
  expect_values(out, 8, {-37.625f, 7, 7, 7, 7, 7, 7, -7});                   // entry 1 = 43, 8 x 7
  expect_values(out, 16, {-7, -21.875f, -7, -7, -21.875f, -37.625f, -37.625f, -37.625f});  // entry 255
  expect_all(out, 24, 8, 7.0f);
  expect_all(out, 32, QK_K - 32, 1.0f);
}

// ggml applies signs by multiplying with -1, so a zero scale keeps the sign: -0.0, not +0.0.
TEST(IqDequantize, Iq2XxsZeroScaleKeepsNegativeZeros) {
  BlockIQ2_XXS block{};
  const uint32_t all_negative = 127u | 127u << 7 | 127u << 14 | 127u << 21;
  std::memcpy(reinterpret_cast<uint8_t*>(block.qs) + 4, &all_negative, 4);
  const auto out = dequantize(dequantize_row_iq2_xxs, block);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), 0x80000000u) << i;
  for (int i = 32; i < QK_K; ++i) EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), 0u) << i;
}

// d = 2. Sub-block 0: scale byte 0x52: groups 0-1 (2 + 1/2)/4 * 2 = 1.25, groups 2-3 (5 + 1/2)/4 * 2
// = 2.75. Codes: 511 (all 43), index 0 with sign index 1 (0x81), index 300 with all signs, index 1.
TEST(IqDequantize, Iq2XsHandBuiltBlock) {
  BlockIQ2_XS block{};
  block.d = kHalfTwo;
  block.scales[0] = 0x52;
  block.qs[0] = 511;
  block.qs[1] = 0 | 1 << 9;
  block.qs[2] = 300 | 127 << 9;  // entry 300 = 8, 25, 25, 8, 8, 25, 8, 25
  block.qs[3] = 1;
  const auto out = dequantize(dequantize_row_iq2_xs, block);
  expect_all(out, 0, 8, 53.75f);
  expect_values(out, 8, {-10, 10, 10, 10, 10, 10, 10, -10});
  expect_values(out, 16, {-22, -68.75f, -68.75f, -22, -22, -68.75f, -22, -68.75f});
  expect_values(out, 24, {118.25f, 22, 22, 22, 22, 22, 22, 22});
  expect_all(out, 32, QK_K - 32, 2.0f);  // scale 0: 8 * (1/2)/4 * 2
}

// d = 1, scales 0x31: 0.375 then 0.875. qh[0] = 0x23 gives group 0 high bits 3 (index 1023, all
// 43), group 1 none (index 1), group 2 high bits 2 (index 0x2c5). Signs are plain bytes.
TEST(IqDequantize, Iq2SHandBuiltBlock) {
  BlockIQ2_S block{};
  block.d = kHalfOne;
  block.scales[0] = 0x31;
  const uint8_t low_index[4] = {0xff, 0x01, 0xc5, 0x00}, signs[4] = {0x01, 0x80, 0xf0, 0x00};
  std::memcpy(block.qs, low_index, 4);
  std::memcpy(block.qs + QK_K / 8, signs, 4);
  block.qh[0] = 0x23;
  const auto out = dequantize(dequantize_row_iq2_s, block);
  expect_values(out, 0, {-16.125f, 16.125f, 16.125f, 16.125f, 16.125f, 16.125f, 16.125f, 16.125f});
  expect_values(out, 8, {16.125f, 3, 3, 3, 3, 3, 3, -3});
  // entry 0x2c5 = 25, 8, 43, 8, 8, 25, 25, 25 at 0.875
  expect_values(out, 16, {21.875f, 7, 37.625f, 7, -7, -21.875f, -21.875f, -21.875f});
  expect_all(out, 24, 8, 7.0f);
  expect_all(out, 32, QK_K - 32, 1.0f);
}

// d = 1. Sub-block 0: index pairs (0, 1), (200, 0), then zeros; sign index 2 (0x82) for group 0;
// scale nibble 1 = (1 + 1/2) / 2 = 0.75. Other sub-blocks: scale 0.25, every magnitude 4.
TEST(IqDequantize, Iq3XxsHandBuiltBlock) {
  BlockIQ3_XXS block{};
  block.d = kHalfOne;
  const uint8_t indices[8] = {0, 1, 200, 0, 0, 0, 0, 0};
  const uint32_t signs_and_scale = 2u | 1u << 28;
  std::memcpy(block.qs, indices, 8);
  std::memcpy(block.qs + QK_K / 4, &signs_and_scale, 4);
  const auto out = dequantize(dequantize_row_iq3_xxs, block);
  expect_values(out, 0, {3, -3, 3, 3, 15, 3, 3, -3});        // 4,4,4,4 | 20,4,4,4
  expect_values(out, 8, {3, 46.5f, 3, 33, 3, 3, 3, 3});      // entry 200 = 4, 62, 4, 44
  expect_all(out, 16, 16, 3.0f);
  expect_all(out, 32, QK_K - 32, 1.0f);
}

// d = 1/2. Scale nibbles: sub-block 0 -> 2 (5 * d = 2.5), sub-block 1 -> 1 (1.5), rest 0 (0.5).
// qh[0] = 0x05: bit 0 lifts index 0 to 511 (1, 1, 15, 15), bit 2 lifts index 2 to 0x101 (5, 7, 9, 5);
// index 1 stays 1 (3, 1, 1, 1), index 3 stays 0 (1, 1, 1, 1). Signs: the first 4 values negative.
TEST(IqDequantize, Iq3SHandBuiltBlock) {
  BlockIQ3_S block{};
  block.d = kHalfHalf;
  block.scales[0] = 0x12;
  const uint8_t low_index[4] = {0xff, 0x01, 0x01, 0x00};
  std::memcpy(block.qs, low_index, 4);
  block.qh[0] = 0x05;
  block.signs[0] = 0x0f;
  const auto out = dequantize(dequantize_row_iq3_s, block);
  expect_values(out, 0, {-2.5f, -2.5f, -37.5f, -37.5f, 7.5f, 2.5f, 2.5f, 2.5f});
  expect_values(out, 8, {12.5f, 17.5f, 22.5f, 12.5f, 2.5f, 2.5f, 2.5f, 2.5f});
  expect_all(out, 16, 16, 2.5f);
  expect_all(out, 32, 32, 1.5f);
  expect_all(out, 64, QK_K - 64, 0.5f);
}

// d = 1. Sub-block 0: qh = high bits 7 (group 0), 0, 5 (group 2), 0; scale 2 -> 5; delta negative.
// Index 2047 is all +1, index 0 all -1, 0x5a3 = -1,-1,-1,1,-1,-1,-1,1, index 1 = 1 then -1s.
// Other sub-blocks: scale 1, delta +1/8, index 0: every value -0.875.
TEST(IqDequantize, Iq1SHandBuiltBlock) {
  BlockIQ1_S block{};
  block.d = kHalfOne;
  const uint8_t low_index[4] = {0xff, 0x00, 0xa3, 0x01};
  std::memcpy(block.qs, low_index, 4);
  block.qh[0] = uint16_t(7 | 0 << 3 | 5 << 6 | 0 << 9 | 2 << 12 | 0x8000);
  const auto out = dequantize(dequantize_row_iq1_s, block);
  const float plus = 5 * (1 - 0.125f), minus = 5 * (-1 - 0.125f);  // 4.375, -5.625
  expect_all(out, 0, 8, plus);
  expect_all(out, 8, 8, minus);
  expect_values(out, 16, {minus, minus, minus, plus, minus, minus, minus, plus});
  expect_values(out, 24, {plus, minus, minus, minus, minus, minus, minus, minus});
  expect_all(out, 32, QK_K - 32, -0.875f);
}

// The fp16 scale 0x3a48 (201/256) is spread over the top nibbles of the four scale words: 8, 4,
// a, 3. Word 0's low 12 bits hold the 3-bit scales 1, 2 (sub-block 0) and 3, 0 (sub-block 1).
// qh[0] = 0x0f: group 0 high bits 7 with delta -1/8, group 1 index 0 with +1/8; qh[1] = 0x85:
// group 2 high bits 5 with +1/8, group 3 index 1 with -1/8.
TEST(IqDequantize, Iq1MHandBuiltBlock) {
  BlockIQ1_M block{};
  const uint16_t words[4] = {uint16_t(0x8000 | 1 | 2 << 3 | 3 << 6), 0x4000, 0xa000, 0x3000};
  std::memcpy(block.scales, words, sizeof words);
  const uint8_t low_index[4] = {0xff, 0x00, 0xa3, 0x01};
  std::memcpy(block.qs, low_index, 4);
  block.qh[0] = 0x0f;
  block.qh[1] = 0x85;
  const auto out = dequantize(dequantize_row_iq1_m, block);
  const float d = 201.0f / 256;  // every product below is exact in float
  const float a = 3 * d, b = 5 * d;
  expect_all(out, 0, 8, a * 0.875f);
  expect_all(out, 8, 8, a * -0.875f);
  const float lo = b * -0.875f, hi = b * 1.125f;
  expect_values(out, 16, {lo, lo, lo, hi, lo, lo, lo, hi});
  expect_values(out, 24, {b * 0.875f, b * -1.125f, b * -1.125f, b * -1.125f, b * -1.125f,
                          b * -1.125f, b * -1.125f, b * -1.125f});
  expect_all(out, 32, 16, 7 * d * -0.875f);  // sub-block 1: scales 7 and 1, index 0, delta +1/8
  expect_all(out, 48, 16, d * -0.875f);
  expect_all(out, 64, QK_K - 64, d * -0.875f);
}

namespace {

// Sets a block's super-block scale to 1 (scaled = false) or to a larger power of two.
void set_fp16_scale(uint8_t* block, bool scaled) {
  std::memcpy(block, scaled ? &kHalfTwo : &kHalfOne, 2);  // d is the first field
}
void set_iq1_m_scale(uint8_t* block, bool scaled) {
  // top nibbles of the scale words: 8, 4, a, 3 = 0x3a48; 8, 4, a, 4 = 0x4a48, 16 times as large
  const uint8_t tops[4] = {0x8, 0x4, 0xa, uint8_t(scaled ? 0x4 : 0x3)};
  for (int w = 0; w < 4; ++w) {
    uint8_t& high_byte = block[offsetof(BlockIQ1_M, scales) + 2 * w + 1];
    high_byte = uint8_t((high_byte & 0x0f) | tops[w] << 4);
  }
}

}  // namespace

// A row of several blocks: each block is read with its own scale. Blocks 0 and 1 are the same
// random bytes; block 2 is them again with a larger power-of-two scale, so its values are exactly
// block 0's times that factor.
TEST(IqDequantize, EveryBlockOfARowUsesItsOwnScale) {
  struct Case {
    const char* name;
    size_t bytes;
    void (*convert)(const void*, float*, int64_t);
    void (*set_scale)(uint8_t*, bool);
    float factor;
  };
  const Case cases[] = {
      {"iq2_xxs", sizeof(BlockIQ2_XXS), dequantize_row_iq2_xxs, set_fp16_scale, 2},
      {"iq2_xs", sizeof(BlockIQ2_XS), dequantize_row_iq2_xs, set_fp16_scale, 2},
      {"iq2_s", sizeof(BlockIQ2_S), dequantize_row_iq2_s, set_fp16_scale, 2},
      {"iq3_xxs", sizeof(BlockIQ3_XXS), dequantize_row_iq3_xxs, set_fp16_scale, 2},
      {"iq3_s", sizeof(BlockIQ3_S), dequantize_row_iq3_s, set_fp16_scale, 2},
      {"iq1_s", sizeof(BlockIQ1_S), dequantize_row_iq1_s, set_fp16_scale, 2},
      {"iq1_m", sizeof(BlockIQ1_M), dequantize_row_iq1_m, set_iq1_m_scale, 16},
  };
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    std::vector<uint8_t> row(3 * c.bytes);
    for (size_t i = 0; i < c.bytes; ++i) row[i] = uint8_t(rng());
    for (int b = 1; b < 3; ++b) std::memcpy(&row[b * c.bytes], &row[0], c.bytes);
    for (int b = 0; b < 3; ++b) c.set_scale(&row[b * c.bytes], b == 2);
    std::vector<float> out(3 * QK_K, NAN);
    c.convert(row.data(), out.data(), 3 * QK_K);
    for (int i = 0; i < QK_K; ++i) {
      ASSERT_TRUE(std::isfinite(out[i]) && out[i] != 0) << c.name << " value " << i;
      ASSERT_EQ(out[QK_K + i], out[i]) << c.name << " value " << i;
      ASSERT_EQ(out[2 * QK_K + i], c.factor * out[i]) << c.name << " value " << i;
    }
  }
}
