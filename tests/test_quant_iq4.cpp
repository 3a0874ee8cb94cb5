// Unit tests of the lookup-table 4-bit formats IQ4_NL, IQ4_XS and MXFP4: the dequantizers worked
// out by hand from the format (table, nibble order, scale arithmetic), and the properties lode's
// own IQ4_NL / IQ4_XS quantizers promise: valid blocks that always dequantize to finite values,
// exact zeros, near-exact constants, scale invariance, sane behaviour at the extremes of float,
// and a clear win over plain rounding. The golden test (test_quant_golden.cpp) compares the same
// code with ggml itself.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/dequant.h"

using namespace lode;
using namespace lode::quant;

namespace {

constexpr int8_t kTable[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
constexpr int8_t kFp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// One of lode's quantizers with its dequantizer and block geometry.
struct Format {
  const char* name;
  int block_values;
  size_t block_bytes;
  void (*quantize)(const float*, void*, int64_t);
  void (*dequantize)(const void*, float*, int64_t);
};
const Format kIq4Nl{"iq4_nl", QK4_NL, sizeof(BlockIQ4_NL), quantize_row_iq4_nl, dequantize_row_iq4_nl};
const Format kIq4Xs{"iq4_xs", QK_K, sizeof(BlockIQ4_XS), quantize_row_iq4_xs, dequantize_row_iq4_xs};
const Format kFormats[] = {kIq4Nl, kIq4Xs};

struct RoundTrip {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

RoundTrip round_trip(const Format& f, const std::vector<float>& x) {
  RoundTrip r{std::vector<uint8_t>(x.size() / f.block_values * f.block_bytes), std::vector<float>(x.size())};
  f.quantize(x.data(), r.bytes.data(), int64_t(x.size()));
  f.dequantize(r.bytes.data(), r.values.data(), int64_t(x.size()));
  return r;
}

double rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(sum / double(a.size()));
}

double rms(const std::vector<float>& a) { return rmse(a, std::vector<float>(a.size(), 0.0f)); }

std::vector<float> gaussian(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// The fp16 scale stored first in every IQ4_NL and IQ4_XS block.
uint16_t scale_bits(const Format& f, const RoundTrip& r, size_t block) {
  uint16_t d;
  std::memcpy(&d, r.bytes.data() + block * f.block_bytes, 2);
  return d;
}

// --- a plain rounding quantizer, the baseline the search must beat ------------------------------

int nearest_entry(double t) {
  int best = 0;
  for (int c = 1; c < 16; ++c)
    if (std::abs(t - kTable[c]) < std::abs(t - kTable[best])) best = c;
  return best;
}

// Puts the group's largest magnitude on the table's -127 end, rounds that scale to fp16, then
// rounds every value to its nearest entry. Returns the round-trip values.
std::vector<float> plain_rounding_iq4_nl(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t b = 0; b < x.size(); b += 32) {
    float extreme = 0;
    for (size_t j = b; j < b + 32; ++j) extreme = std::abs(x[j]) > std::abs(extreme) ? x[j] : extreme;
    const float d = fp16_to_fp32(fp32_to_fp16(extreme / -127.0f));
    for (size_t j = b; j < b + 32; ++j) out[j] = d == 0 ? 0 : d * kTable[nearest_entry(x[j] / d)];
  }
  return out;
}

}  // namespace

// --- dequantizers, from the format ---------------------------------------------------------------

TEST(Iq4NlDequantize, TableEntryTimesScaleLowNibblesFirst) {
  BlockIQ4_NL block;
  block.d = 0x3a00;  // 0.75
  for (int j = 0; j < 16; ++j) block.qs[j] = uint8_t(j | (15 - j) << 4);
  float out[32];
  dequantize_row_iq4_nl(&block, out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(bits(out[j]), bits(0.75f * kTable[j])) << j;
    EXPECT_EQ(bits(out[j + 16]), bits(0.75f * kTable[15 - j])) << j + 16;
  }
}

TEST(Iq4NlDequantize, BlocksFollowEachOtherAndKeepTheirOwnScale) {
  BlockIQ4_NL blocks[2];
  blocks[0].d = 0x3c00;  // 1
  blocks[1].d = 0xc000;  // -2
  std::memset(blocks[0].qs, 0x00, 16);  // every code 0: -127
  std::memset(blocks[1].qs, 0xff, 16);  // every code 15: 113
  float out[64];
  dequantize_row_iq4_nl(blocks, out, 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(out[j], -127.0f);
    EXPECT_EQ(out[32 + j], -226.0f);
  }
}

TEST(Iq4XsDequantize, SixBitMultipliersSplitAcrossScalesLowAndHigh) {
  // ls = multiplier + 32, low 4 bits in scales_l (even sub-block: low nibble), high 2 bits in
  // scales_h (bits 2ib, 2ib+1).
  const int multipliers[8] = {-32, -31, -1, 0, 1, 15, 30, 31};
  BlockIQ4_XS block;
  block.d = 0x3500;  // 0.3125
  block.scales_h = 0;
  std::memset(block.scales_l, 0, sizeof block.scales_l);
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = multipliers[ib] + 32;
    block.scales_l[ib / 2] |= uint8_t((ls & 0xf) << (4 * (ib % 2)));
    block.scales_h |= uint16_t((ls >> 4) << (2 * ib));
    for (int j = 0; j < 16; ++j) block.qs[16 * ib + j] = uint8_t((j + ib) % 16 | ((j + 3 * ib) % 16) << 4);
  }
  float out[256];
  dequantize_row_iq4_xs(&block, out, 256);
  for (int ib = 0; ib < 8; ++ib) {
    const float scale = 0.3125f * float(multipliers[ib]);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(bits(out[32 * ib + j]), bits(scale * kTable[(j + ib) % 16])) << ib << " " << j;
      EXPECT_EQ(bits(out[32 * ib + j + 16]), bits(scale * kTable[(j + 3 * ib) % 16])) << ib << " " << j;
    }
  }
}

TEST(Mxfp4Dequantize, SharedExponentIsHalfOfTwoToTheEMinus127) {
  // ggml's table holds the FP4 E2M1 values doubled; the shared scale is 2^(e-128) to match,
  // subnormal for e < 2, and e = 255 is a number (2^127), not NaN.
  for (int e : {0, 1, 2, 3, 100, 126, 127, 128, 129, 200, 254, 255}) {
    BlockMXFP4 block;
    block.e = uint8_t(e);
    for (int j = 0; j < 16; ++j) block.qs[j] = uint8_t(j | (15 - j) << 4);
    float out[32];
    dequantize_row_mxfp4(&block, out, 32);
    const float scale = std::ldexp(1.0f, e - 128);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(bits(out[j]), bits(scale * kFp4Doubled[j])) << "e " << e << " code " << j;
      EXPECT_EQ(bits(out[j + 16]), bits(scale * kFp4Doubled[15 - j])) << "e " << e << " code " << 15 - j;
    }
  }
}

TEST(Mxfp4Dequantize, WorkedValues) {
  BlockMXFP4 block;
  block.e = 127;  // scale 1/2: the doubled table halves back to E2M1 values
  std::memset(block.qs, 0, sizeof block.qs);
  block.qs[0] = 0x7f;  // value 0: code 15 (-6); value 16: code 7 (6)
  block.qs[1] = 0x95;  // value 1: code 5 (3); value 17: code 9 (-0.5)
  float out[32];
  dequantize_row_mxfp4(&block, out, 32);
  EXPECT_EQ(out[0], -6.0f);
  EXPECT_EQ(out[16], 6.0f);
  EXPECT_EQ(out[1], 3.0f);
  EXPECT_EQ(out[17], -0.5f);
  EXPECT_EQ(bits(out[2]), 0u);  // code 0 is +0
}

// --- quantizers --------------------------------------------------------------------------------

TEST(Iq4Quantize, ZerosStayExactlyZero) {
  for (const Format& f : kFormats) {
    const std::vector<float> x(2 * f.block_values, 0.0f);
    const RoundTrip r = round_trip(f, x);
    for (float v : r.values) ASSERT_EQ(v, 0.0f) << f.name;
  }
}

TEST(Iq4Quantize, ConstantBlocksComeBackAlmostExactly) {
  // A constant is one table entry times a scale; only the fp16 rounding of the scale is lost.
  for (const Format& f : kFormats) {
    for (float c : {1.7f, -1.7f, 0.01f, -321.5f, 12345.0f, 3e-3f}) {
      const RoundTrip r = round_trip(f, std::vector<float>(f.block_values, c));
      for (float v : r.values) ASSERT_NEAR(v, c, std::abs(c) * 0x1p-11f) << f.name << " constant " << c;
    }
  }
}

TEST(Iq4Quantize, OneOutlierAmongZeros) {
  // The table has no 0: the zeros of the outlier's group take the entry nearest zero (1/127 of
  // the -127 end). Putting the outlier exactly on that end leaves 31 * (v/127)^2; the search may
  // shrink the scale a little to trade outlier error for smaller zeros, but never does worse.
  for (const Format& f : kFormats) {
    for (float outlier : {5.0f, -5.0f, 1e-3f, -4e4f}) {
      std::vector<float> x(f.block_values, 0.0f);
      x[7] = outlier;
      const RoundTrip r = round_trip(f, x);
      const double on_the_end = 31 * std::pow(outlier / 127.0, 2);
      const double squares = std::pow(rmse(r.values, x), 2) * double(x.size());
      EXPECT_LE(squares, 1.01 * on_the_end) << f.name << " " << outlier;
      EXPECT_NEAR(r.values[7], outlier, std::abs(outlier) * 0.01f) << f.name << " " << outlier;
      for (int j = 0; j < f.block_values; ++j)
        if (j != 7)
          ASSERT_LE(std::abs(r.values[j]), std::abs(outlier) / 100) << f.name << " " << outlier << " " << j;
    }
  }
}

TEST(Iq4Quantize, NegativeOnlyValuesFitAsWellAsMixedOnes) {
  for (const Format& f : kFormats) {
    std::vector<float> mixed = gaussian(64 * 256, 1.0f, 11), negative = mixed;
    for (float& v : negative) v = -std::abs(v);
    const double mixed_error = rmse(round_trip(f, mixed).values, mixed) / rms(mixed);
    const double negative_error = rmse(round_trip(f, negative).values, negative) / rms(negative);
    EXPECT_LT(mixed_error, 0.08) << f.name;
    EXPECT_LT(negative_error, 0.08) << f.name;
  }
}

TEST(Iq4Quantize, PowerOfTwoScalingOnlyScalesTheStoredScale) {
  // The search runs on values normalised by a power of two, so as long as the fp16 scale stays
  // a normal half, scaling the input by 2^k changes d by exactly 2^k and nothing else.
  for (const Format& f : kFormats) {
    const std::vector<float> x = gaussian(4 * 256, 1.0f, 5);
    const RoundTrip base = round_trip(f, x);
    for (int k : {-2, 1, 5, 12}) {
      std::vector<float> scaled = x;
      for (float& v : scaled) v = std::ldexp(v, k);
      const RoundTrip r = round_trip(f, scaled);
      for (size_t b = 0; b < x.size() / f.block_values; ++b) {
        EXPECT_EQ(fp16_to_fp32(scale_bits(f, r, b)), std::ldexp(fp16_to_fp32(scale_bits(f, base, b)), k))
            << f.name << " k " << k << " block " << b;
        const uint8_t* codes = r.bytes.data() + b * f.block_bytes + 2;
        const uint8_t* base_codes = base.bytes.data() + b * f.block_bytes + 2;
        EXPECT_EQ(std::memcmp(codes, base_codes, f.block_bytes - 2), 0)
            << f.name << " k " << k << " block " << b;
      }
    }
  }
}

TEST(Iq4Quantize, BeyondHalfRangeSaturatesAtTheLargestScale) {
  // No fp16 scale reaches 1e30: the largest half (65504) is the best there is, and the values
  // keep their signs rather than turning into infinities.
  for (const Format& f : kFormats) {
    std::vector<float> x = gaussian(f.block_values, 1e30f, 3);
    x[0] = std::numeric_limits<float>::max();
    x[1] = -std::numeric_limits<float>::max();
    const RoundTrip r = round_trip(f, x);
    EXPECT_EQ(std::abs(fp16_to_fp32(scale_bits(f, r, 0))), 65504.0f) << f.name;
    for (int j = 0; j < f.block_values; ++j) {
      ASSERT_TRUE(std::isfinite(r.values[j])) << f.name << " " << j;
      if (std::abs(x[j]) > 1e29f)
        EXPECT_EQ(std::signbit(r.values[j]), std::signbit(x[j])) << f.name << " " << j;
    }
  }
}

TEST(Iq4Quantize, BelowHalfRangeBecomesZero) {
  // Values this small are nearer 0 than to the smallest subnormal half times any table entry.
  for (const Format& f : kFormats) {
    for (float sigma : {1e-12f, 1e-30f, 1e-40f}) {
      const std::vector<float> x = gaussian(f.block_values, sigma, 9);
      const RoundTrip r = round_trip(f, x);
      for (float v : r.values) ASSERT_EQ(v, 0.0f) << f.name << " sigma " << sigma;
    }
  }
}

TEST(Iq4Quantize, SubnormalScalesStillCarrySignal) {
  // 1e-5-sized values need fp16 scales below 2^-14 (subnormal): coarse, but better than zero.
  for (const Format& f : kFormats) {
    const std::vector<float> x = gaussian(16 * 256, 1e-5f, 13);
    EXPECT_LT(rmse(round_trip(f, x).values, x), 0.5 * rms(x)) << f.name;
  }
}

TEST(Iq4Quantize, RejectsValuesThatAreNotFinite) {
  for (const Format& f : kFormats) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x = gaussian(f.block_values, 1.0f, 1);
      x[3] = bad;
      std::vector<uint8_t> bytes(f.block_bytes);
      EXPECT_THROW(f.quantize(x.data(), bytes.data(), f.block_values), Error) << f.name << " " << bad;
    }
  }
}

TEST(Iq4Quantize, EveryBlockDequantizesToFiniteValues) {
  // Random shapes (gaussian, heavy tails, sparse, one-signed, constant runs) at random
  // magnitudes over the whole float range.
  std::mt19937 rng(2024);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::normal_distribution<float> normal;
  std::cauchy_distribution<float> cauchy;
  for (const Format& f : kFormats) {
    for (int trial = 0; trial < 300; ++trial) {
      const float magnitude = std::ldexp(1.0f, int(unit(rng) * 250) - 125);
      const int shape = trial % 5;
      std::vector<float> x(f.block_values);
      for (float& v : x) {
        float u = shape == 1 ? std::clamp(cauchy(rng), -1e6f, 1e6f) : normal(rng);
        if (shape == 2 && unit(rng) < 0.9f) u = 0;
        if (shape == 3) u = std::abs(u);
        if (shape == 4) u = 1.0f + (unit(rng) < 0.1f ? u : 0.0f);
        v = u * magnitude;
      }
      const RoundTrip r = round_trip(f, x);
      for (int j = 0; j < f.block_values; ++j)
        ASSERT_TRUE(std::isfinite(r.values[j])) << f.name << " trial " << trial << " value " << j;
    }
  }
}

TEST(Iq4Quantize, RowsAreQuantizedBlockByBlock) {
  for (const Format& f : kFormats) {
    const std::vector<float> x = gaussian(3 * f.block_values, 2.0f, 17);
    const RoundTrip row = round_trip(f, x);
    for (int b = 0; b < 3; ++b) {
      std::vector<uint8_t> single(f.block_bytes);
      f.quantize(x.data() + b * f.block_values, single.data(), f.block_values);
      EXPECT_EQ(std::memcmp(single.data(), row.bytes.data() + b * f.block_bytes, f.block_bytes), 0)
          << f.name << " " << b;
    }
  }
}

TEST(Iq4Quantize, SearchBeatsPlainRounding) {
  // On gaussians plain rounding leaves about 8% more error than lode (ggml's reference quantizer,
  // compared in the golden test, about 7% for IQ4_NL and 4% for IQ4_XS).
  const std::vector<float> x = gaussian(256 * 256, 1.0f, 21);
  const double plain = rmse(plain_rounding_iq4_nl(x), x);
  const double nl = rmse(round_trip(kIq4Nl, x).values, x), xs = rmse(round_trip(kIq4Xs, x).values, x);
  EXPECT_LT(nl, 0.94 * plain) << "iq4_nl " << nl << " vs plain rounding " << plain;
  EXPECT_LT(xs, 0.95 * plain) << "iq4_xs " << xs << " vs plain rounding " << plain;
}

TEST(Iq4Quantize, XsSubBlocksOfDifferentSizesEachKeepTheirShape) {
  // Sub-block magnitudes 1, 1/2, ... 1/8 share one fp16 d through 6-bit multipliers; even the
  // smallest keeps a relative error close to a sub-block of its own.
  std::vector<float> x = gaussian(32 * 256, 1.0f, 23);
  for (size_t i = 0; i < x.size(); ++i) x[i] *= std::ldexp(1.0f, -int((i / 32) % 8) / 2);
  const RoundTrip r = round_trip(kIq4Xs, x);
  for (int ib = 0; ib < 8; ++ib) {
    std::vector<float> part, back;
    for (size_t i = 0; i < x.size(); ++i)
      if ((i / 32) % 8 == size_t(ib)) {
        part.push_back(x[i]);
        back.push_back(r.values[i]);
      }
    EXPECT_LT(rmse(back, part) / rms(part), 0.1) << "sub-block " << ib;
  }
}
