#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/fp16.h"
#include "core/quant/dequant.h"

using namespace lode;

TEST(Fp16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f)))) << std::hex << h;
      continue;
    }
    EXPECT_EQ(fp32_to_fp16(f), h) << std::hex << h;
  }
}

// A row converter (F16C where the host has it) gives every half fp16_to_fp32's bits, NaN payloads
// included; rows of every length up to 17 reach its scalar tail.
TEST(Fp16, RowsConvertEveryHalfAsOneHalf) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = uint16_t(h);
  std::vector<float> got(all.size());
  quant::dequantize_row_f16(all.data(), got.data(), int64_t(all.size()));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float want = fp16_to_fp32(uint16_t(h));
    ASSERT_EQ(0, std::memcmp(&want, &got[h], sizeof want)) << std::hex << h;
  }
  for (int64_t n = 1; n <= 17; ++n) {
    std::vector<float> part(static_cast<size_t>(n));
    quant::dequantize_row_f16(all.data() + 0x7bf0, part.data(), n);  // (finite, infinities and NaNs)
    EXPECT_EQ(0, std::memcmp(part.data(), got.data() + 0x7bf0, size_t(n) * sizeof(float))) << n;
  }
}

TEST(Fp16, SignallingNaNComesOutQuietAsInGgml) {
  EXPECT_EQ(std::bit_cast<uint32_t>(fp16_to_fp32(0x7c01)), 0x7fc02000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(fp16_to_fp32(0xfe00)), 0xffc00000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(fp16_to_fp32(0x7c00)), 0x7f800000u);  // infinity stays
}

TEST(Fp16, RoundsToNearestEven) {
  // 1 + 2^-11 lies exactly between 1 and the next half (1 + 2^-10): ties go to the even one.
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(-std::ldexp(3.0f, -25)), 0x8002);  // 1.5 units: tie -> even (2)
}

TEST(Bf16, RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(fp32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
}
