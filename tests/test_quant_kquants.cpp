// The k-quants (Q2_K..Q6_K): scale packing, block layouts worked out by hand, and the Q4_K/Q5_K/
// Q6_K quantizers (round-trip error, nearest codes, edge-case inputs). Bit-exactness against ggml
// itself is the golden-vector test's job (test_quant_golden.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/dequant.h"
#include "core/quant/kquants_scales.h"

using namespace lode;
using namespace lode::quant;

namespace {

// --- scale packing ------------------------------------------------------------------------------

TEST(KQuantScales, Q4KPackingRoundTripsEveryValueInEverySlot) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 2000; ++trial) {
    uint8_t scales[8], mins[8], packed[12];
    for (int j = 0; j < 8; ++j) scales[j] = uint8_t(rng() % 64), mins[j] = uint8_t(rng() % 64);
    if (trial < 64) std::memset(scales, trial, 8), std::memset(mins, 63 - trial, 8);  // every value
    pack_scales_mins_k4(scales, mins, packed);
    for (int j = 0; j < 8; ++j) {
      const ScaleMin sm = unpack_scale_min_k4(packed, j);
      ASSERT_EQ(sm.scale, scales[j]) << "trial " << trial << " slot " << j;
      ASSERT_EQ(sm.min, mins[j]) << "trial " << trial << " slot " << j;
    }
  }
}

TEST(KQuantScales, Q4KLayoutMatchesTheFormat) {
  // Pair 1 = (5, 9) sits whole in bytes 1 and 5; pair 6 = (50, 17) = (0b110010, 0b010001) keeps
  // its low nibbles in byte 10 and its top bits at the top of bytes 2 (scale) and 6 (min).
  uint8_t packed[12] = {};
  packed[1] = 5, packed[5] = 9;
  packed[10] = 0x12;                 // scale low 0x2, min low 0x1
  packed[2] = 3 << 6, packed[6] = 1 << 6;
  EXPECT_EQ(unpack_scale_min_k4(packed, 1).scale, 5);
  EXPECT_EQ(unpack_scale_min_k4(packed, 1).min, 9);
  EXPECT_EQ(unpack_scale_min_k4(packed, 6).scale, 50);
  EXPECT_EQ(unpack_scale_min_k4(packed, 6).min, 17);
  EXPECT_EQ(unpack_scale_min_k4(packed, 2).scale, 0);  // the top bits belong to pair 6 only
  EXPECT_EQ(unpack_scale_min_k4(packed, 2).min, 0);
}

TEST(KQuantScales, Q3KPackingRoundTripsEveryValueInEverySlot) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 2000; ++trial) {
    int8_t scales[16];
    uint8_t packed[12];
    for (int j = 0; j < 16; ++j) scales[j] = int8_t(int(rng() % 64) - 32);
    if (trial < 64) std::memset(scales, trial - 32, 16);
    pack_scales_q3_k(scales, packed);
    for (int j = 0; j < 16; ++j) ASSERT_EQ(unpack_scale_q3_k(packed, j), scales[j]) << trial << " " << j;
  }
}

// --- dequantizers on hand-built blocks ---------------------------------------------------------

std::vector<float> dequantized(void (*dequantize)(const void*, float*, int64_t), const void* block) {
  std::vector<float> y(QK_K);
  dequantize(block, y.data(), QK_K);
  return y;
}

TEST(KQuantDequantize, Q2KHandBuiltBlock) {
  BlockQ2_K b{};
  b.d = fp32_to_fp16(0.5f), b.dmin = fp32_to_fp16(0.25f);
  b.scales[4] = 0x35;    // sub-block 4 (values 64..79): scale 5, min 3
  b.qs[13] = 3 << 4;     // value 77 = first half, shift group 2, byte 13: code 3
  const auto y = dequantized(dequantize_row_q2_K, &b);
  EXPECT_EQ(y[77], 0.5f * 5 * 3 - 0.25f * 3);
  EXPECT_EQ(y[78], -0.25f * 3);  // code 0 in the same sub-block
  EXPECT_EQ(y[0], 0.0f);
}

TEST(KQuantDequantize, Q3KHandBuiltBlock) {
  BlockQ3_K b{};
  b.d = fp32_to_fp16(0.5f);
  int8_t scales[16];
  std::memset(scales, 0, sizeof scales);
  scales[4] = -7, scales[12] = 31;
  pack_scales_q3_k(scales, b.scales);
  b.qs[13] = 2 << 4, b.hmask[13] = 1 << 2;   // value 77: low bits 2, high bit set -> 2
  b.qs[14] = 1 << 4;                         // value 78: low bits 1, high bit clear -> 1 - 4
  b.qs[40] = 3 << 4, b.hmask[8] = 1 << 6;    // value 200 (second half, group 2, byte 8): 3
  const auto y = dequantized(dequantize_row_q3_K, &b);
  EXPECT_EQ(y[77], 0.5f * -7 * 2);
  EXPECT_EQ(y[78], 0.5f * -7 * -3);
  EXPECT_EQ(y[200], 0.5f * 31 * 3);
  EXPECT_EQ(y[0], 0.0f);  // scale 0, code -4
}

TEST(KQuantDequantize, Q4KAndQ5KHandBuiltBlocks) {
  uint8_t scales[8] = {3, 0, 0, 0, 0, 40, 0, 0}, mins[8] = {2, 0, 0, 0, 0, 17, 0, 0};
  BlockQ4_K b4{};
  b4.d = fp32_to_fp16(0.5f), b4.dmin = fp32_to_fp16(0.25f);
  pack_scales_mins_k4(scales, mins, b4.scales);
  b4.qs[0] = 0x07;        // value 0: sub-block 0, low nibble
  b4.qs[64 + 3] = 0xa0;   // value 163: sub-block 5 = high nibbles of group 2, byte 3
  const auto y4 = dequantized(dequantize_row_q4_K, &b4);
  EXPECT_EQ(y4[0], 0.5f * 3 * 7 - 0.25f * 2);
  EXPECT_EQ(y4[163], 0.5f * 40 * 10 - 0.25f * 17);
  EXPECT_EQ(y4[160], -0.25f * 17);

  BlockQ5_K b5{};
  b5.d = b4.d, b5.dmin = b4.dmin;
  std::memcpy(b5.scales, b4.scales, sizeof b5.scales);
  std::memcpy(b5.qs, b4.qs, sizeof b5.qs);
  b5.qh[3] = 1 << 5;      // fifth bit of value 163 (sub-block 5, byte 3)
  const auto y5 = dequantized(dequantize_row_q5_K, &b5);
  EXPECT_EQ(y5[0], y4[0]);
  EXPECT_EQ(y5[163], 0.5f * 40 * 26 - 0.25f * 17);
}

TEST(KQuantDequantize, Q6KHandBuiltBlock) {
  BlockQ6_K b{};
  b.d = fp32_to_fp16(0.5f);
  b.scales[4] = -3, b.scales[12] = 100;
  b.ql[13] = 0x50, b.qh[13] = 2 << 4;        // value 77: low nibble 5 (high half of byte 13), top 2
  b.ql[64 + 8] = 0xf0, b.qh[32 + 8] = 3 << 4;  // value 200: low 15, top 3
  const auto y = dequantized(dequantize_row_q6_K, &b);
  EXPECT_EQ(y[77], 0.5f * -3 * (5 + 32 - 32));
  EXPECT_EQ(y[200], 0.5f * 100 * (15 + 48 - 32));
  EXPECT_EQ(y[64], 0.5f * -3 * -32);  // all-zero bits: code -32
}

// --- quantizers ---------------------------------------------------------------------------------

struct KQuant {
  const char* name;
  size_t block_bytes;
  void (*quantize)(const float*, void*, int64_t);
  void (*dequantize)(const void*, float*, int64_t);
  double max_rmse_per_sigma;  // on N(0, sigma) data; ggml's reference quantizers reach
                              // 0.0716 (q4_K), 0.0363 (q5_K), 0.0178 (q6_K)
};

void PrintTo(const KQuant& k, std::ostream* os) { *os << k.name; }

const KQuant kQuantizers[] = {
    {"q4_K", sizeof(BlockQ4_K), quantize_row_q4_K, dequantize_row_q4_K, 0.0705},
    {"q5_K", sizeof(BlockQ5_K), quantize_row_q5_K, dequantize_row_q5_K, 0.0352},
    {"q6_K", sizeof(BlockQ6_K), quantize_row_q6_K, dequantize_row_q6_K, 0.0172},
};

std::vector<float> round_trip(const KQuant& k, const std::vector<float>& x, std::vector<uint8_t>* bytes = nullptr) {
  std::vector<uint8_t> q(x.size() / QK_K * k.block_bytes);
  k.quantize(x.data(), q.data(), int64_t(x.size()));
  std::vector<float> y(x.size());
  k.dequantize(q.data(), y.data(), int64_t(x.size()));
  if (bytes) *bytes = std::move(q);
  return y;
}

double rmse(const std::vector<float>& x, const std::vector<float>& y) {
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) sum += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  return std::sqrt(sum / double(x.size()));
}

std::vector<float> gaussian(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

void expect_all_finite(const KQuant& k, const std::vector<float>& y, const char* what) {
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_TRUE(std::isfinite(y[i])) << k.name << " " << what << ": value " << i << " = " << y[i];
}

class KQuantQuantize : public testing::TestWithParam<KQuant> {};

TEST_P(KQuantQuantize, GaussianRoundTripBeatsGgmlsReferenceError) {
  const KQuant& k = GetParam();
  for (float sigma : {1.0f, 0.02f}) {
    const auto x = gaussian(QK_K * 256, sigma, 3);
    EXPECT_LE(rmse(x, round_trip(k, x)), k.max_rmse_per_sigma * sigma) << k.name << " sigma " << sigma;
  }
}

// Each value must sit on the grid point nearest to it among all codes its sub-block offers: a
// code packed into the wrong bit position, or a grid the search measured differently from the
// dequantizer, shows up here.
TEST_P(KQuantQuantize, EveryValueGetsItsNearestCode) {
  const KQuant& k = GetParam();
  const auto x = gaussian(QK_K * 32, 1.0f, 4);
  std::vector<uint8_t> bytes;
  const auto y = round_trip(k, x, &bytes);
  for (size_t b = 0; b < x.size() / QK_K; ++b) {
    const uint8_t* block = bytes.data() + b * k.block_bytes;
    for (int i = 0; i < QK_K; ++i) {
      std::vector<float> grid;
      if (k.block_bytes == sizeof(BlockQ6_K)) {
        const auto* q6 = reinterpret_cast<const BlockQ6_K*>(block);
        const float d = fp16_to_fp32(q6->d);
        for (int q = -32; q < 32; ++q) grid.push_back(d * float(q6->scales[i / 16]) * float(q));
      } else {  // Q4_K and Q5_K share the header layout
        const auto* q4 = reinterpret_cast<const BlockQ4_K*>(block);
        const ScaleMin sm = unpack_scale_min_k4(q4->scales, i / 32);
        const float dl = fp16_to_fp32(q4->d) * float(sm.scale), ml = fp16_to_fp32(q4->dmin) * float(sm.min);
        const int codes = k.block_bytes == sizeof(BlockQ4_K) ? 16 : 32;
        for (int q = 0; q < codes; ++q) grid.push_back(dl * float(q) - ml);
      }
      const float v = x[b * QK_K + i], ours = std::fabs(v - y[b * QK_K + i]);
      for (float g : grid)
        ASSERT_LE(ours, std::fabs(v - g) * (1 + 1e-6f) + 1e-12f)
            << k.name << " block " << b << " value " << i << ": " << v << " -> " << y[b * QK_K + i]
            << " but grid point " << g << " is nearer";
    }
  }
}

TEST_P(KQuantQuantize, ZerosStayZero) {
  const KQuant& k = GetParam();
  const std::vector<float> x(QK_K * 2, 0.0f);
  for (float v : round_trip(k, x)) ASSERT_EQ(v, 0.0f) << k.name;
}

TEST_P(KQuantQuantize, ConstantBlocksAreNearlyExact) {
  const KQuant& k = GetParam();
  for (float c : {1.0f, -3.5f, 0.3f, 1234.5f}) {  // scales in fp16's normal range
    const std::vector<float> x(QK_K, c);
    const auto y = round_trip(k, x);
    for (float v : y) ASSERT_NEAR(v, c, std::fabs(c) * 5e-4f) << k.name << " constant " << c;
  }
}

TEST_P(KQuantQuantize, OneOutlierIsKeptAndOnlyItsBlockPays) {
  const KQuant& k = GetParam();
  auto x = gaussian(QK_K * 4, 1.0f, 5);
  x[300] = 100.0f;  // block 1
  const auto y = round_trip(k, x);
  EXPECT_NEAR(y[300], 100.0f, 1.0f) << k.name;
  for (int b : {0, 2, 3}) {
    const std::vector<float> xb(x.begin() + b * QK_K, x.begin() + (b + 1) * QK_K);
    const std::vector<float> yb(y.begin() + b * QK_K, y.begin() + (b + 1) * QK_K);
    EXPECT_EQ(round_trip(k, xb), yb) << k.name << " block " << b << " depends on the outlier's block";
  }
  // The outlier's block: its other values lose precision, but stay well below their spread.
  const std::vector<float> x1(x.begin() + QK_K, x.begin() + 2 * QK_K);
  const std::vector<float> y1(y.begin() + QK_K, y.begin() + 2 * QK_K);
  EXPECT_LE(rmse(x1, y1), 0.5) << k.name;
}

TEST_P(KQuantQuantize, NegativeOnlyAndPositiveOnlyData) {
  const KQuant& k = GetParam();
  for (float sign : {-1.0f, 1.0f}) {
    auto x = gaussian(QK_K * 16, 1.0f, 6);
    for (float& v : x) v = sign * std::fabs(v);
    // One-signed data have half the range of two-signed ones: an offset grid (Q4_K, Q5_K) spends
    // all its codes on them, a symmetric one (Q6_K) only half.
    const double limit = (k.block_bytes == sizeof(BlockQ6_K) ? 1.0 : 0.6) * k.max_rmse_per_sigma;
    EXPECT_LE(rmse(x, round_trip(k, x)), limit) << k.name << " sign " << sign;
  }
}

TEST_P(KQuantQuantize, OffsetDataUseTheWholeGrid) {
  // Values 10 +- 1: a grid anchored at zero would spend most codes below the data.
  const KQuant& k = GetParam();
  auto x = gaussian(QK_K * 16, 1.0f, 7);
  for (float& v : x) v += 10.0f;
  const double error = rmse(x, round_trip(k, x));
  if (k.block_bytes != sizeof(BlockQ6_K))
    EXPECT_LE(error, 1.5 * k.max_rmse_per_sigma) << k.name;  // zero-anchored: about 3.5x that
  else
    EXPECT_LE(error, 0.12) << k.name;  // symmetric: a step of about 13/32, so about step/sqrt(12)
}

TEST_P(KQuantQuantize, HugeAndTinyMagnitudesDequantizeToFiniteValues) {
  const KQuant& k = GetParam();
  for (float sigma : {1e6f, 1e12f, 1e30f, 1e-5f, 1e-8f, 1e-30f, 1e-40f}) {
    const auto x = gaussian(QK_K * 4, sigma, 8);
    const auto y = round_trip(k, x);
    expect_all_finite(k, y, "gaussian");
    if (sigma == 1e6f) EXPECT_LE(rmse(x, y), 1.01 * k.max_rmse_per_sigma * sigma) << k.name;
    if (sigma <= 1e-8f) EXPECT_LE(rmse(x, y), 1.5 * sigma) << k.name;  // at worst all zeros
  }
  std::vector<float> extremes = gaussian(QK_K, 1.0f, 9);
  extremes[3] = std::numeric_limits<float>::max();
  extremes[4] = -std::numeric_limits<float>::max();
  extremes[5] = std::numeric_limits<float>::denorm_min();
  expect_all_finite(k, round_trip(k, extremes), "float max");
}

TEST_P(KQuantQuantize, MixedMagnitudesAcrossSubBlocksAreAllFinite) {
  const KQuant& k = GetParam();
  std::mt19937 rng(10);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(QK_K);
    for (size_t i = 0; i < x.size(); ++i) {
      const float magnitude = std::pow(10.0f, float(int(rng() % 61) - 30));
      x[i] = std::normal_distribution<float>(0.0f, magnitude)(rng);
    }
    expect_all_finite(k, round_trip(k, x), "mixed magnitudes");
  }
}

TEST_P(KQuantQuantize, NonFiniteInputIsRefused) {
  const KQuant& k = GetParam();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    auto x = gaussian(QK_K * 2, 1.0f, 11);
    x[QK_K + 7] = bad;
    std::vector<uint8_t> q(2 * k.block_bytes);
    EXPECT_THROW(k.quantize(x.data(), q.data(), int64_t(x.size())), Error) << k.name << " " << bad;
  }
}

TEST_P(KQuantQuantize, RowsAreQuantizedBlockByBlock) {
  // A row's blocks do not depend on each other: quantizing blocks one at a time gives the same bytes.
  const KQuant& k = GetParam();
  const auto x = gaussian(QK_K * 3, 1.0f, 12);
  std::vector<uint8_t> whole(3 * k.block_bytes), pieces(3 * k.block_bytes);
  k.quantize(x.data(), whole.data(), int64_t(x.size()));
  for (int b = 0; b < 3; ++b) k.quantize(x.data() + b * QK_K, pieces.data() + b * k.block_bytes, QK_K);
  EXPECT_EQ(whole, pieces) << k.name;
}

INSTANTIATE_TEST_SUITE_P(SearchTypes, KQuantQuantize, testing::ValuesIn(kQuantizers),
                         [](const testing::TestParamInfo<KQuant>& info) { return std::string(info.param.name); });

}  // namespace
