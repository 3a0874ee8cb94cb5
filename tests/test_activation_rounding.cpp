// Activations::q8: activation rows rounded to the 8-bit block formats ggml's CPU path multiplies
// quantized weights with (cpu/activation_rounding.h), and matmul applying that rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "cpu/activation_rounding.h"
#include "cpu/matmul.h"
#include "support/random.h"

namespace {

using lode::GgmlType;

std::vector<float> random_row(size_t n, std::mt19937& rng) {
  std::vector<float> v = lode::test::normal_floats(n, rng);
  v[5] = 9.0f;    // an outlier in the first block: its max
  v[300] = -7.5f; // a negative one in the second Q8_K block
  return v;
}

// Every value of each block is d * q with q an integer in [-127, 127], the block's largest
// magnitude lands on +-127 d, and no value moves by more than half a step.
void expect_blocks(const std::vector<float>& x, const std::vector<float>& out, int64_t block,
                   bool fp16_scale) {
  for (size_t b = 0; b < x.size(); b += size_t(block)) {
    float amax = 0.0f;
    for (int64_t j = 0; j < block; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    float d = amax / 127.0f;
    if (fp16_scale) d = lode::fp16_to_fp32(lode::fp32_to_fp16(d));
    for (int64_t j = 0; j < block; ++j) {
      const float q = out[b + j] / d;
      EXPECT_NEAR(q, std::round(q), 1e-3) << "block at " << b << " value " << j;
      EXPECT_LE(std::fabs(q), 127.0f + 1e-3f);
      EXPECT_LE(std::fabs(out[b + j] - x[b + j]), d * 0.5f * 1.01f + amax * 1e-3f);
      if (std::fabs(x[b + j]) == amax) EXPECT_NEAR(std::fabs(q), 127.0f, 1e-3);
    }
  }
}

TEST(ActivationRounding, TypeFollowsTheWeights) {
  EXPECT_EQ(lode::cpu::activation_type_for(GgmlType::F32), GgmlType::F32);
  EXPECT_EQ(lode::cpu::activation_type_for(GgmlType::F16), GgmlType::F16);
  EXPECT_EQ(lode::cpu::activation_type_for(GgmlType::Q8_0), GgmlType::Q8_0);
  EXPECT_EQ(lode::cpu::activation_type_for(GgmlType::Q4_0), GgmlType::Q8_0);
  EXPECT_EQ(lode::cpu::activation_type_for(GgmlType::Q5_1), GgmlType::Q8_0);
  EXPECT_EQ(lode::cpu::activation_type_for(GgmlType::Q4_K), GgmlType::Q8_K);
  EXPECT_EQ(lode::cpu::activation_type_for(GgmlType::Q6_K), GgmlType::Q8_K);
  EXPECT_EQ(lode::cpu::activation_type_for(GgmlType::IQ4_XS), GgmlType::Q8_K);
}

TEST(ActivationRounding, Q8_0BlocksOf32WithAnFp16Scale) {
  std::mt19937 rng(1);
  const auto x = random_row(512, rng);
  std::vector<float> out(x.size());
  lode::cpu::round_activations(GgmlType::Q8_0, x.data(), out.data(), int64_t(x.size()));
  expect_blocks(x, out, 32, true);
  // The same values as lode's Q8_0 quantizer followed by its dequantizer, but for rounding ties.
  const auto& q8 = lode::traits(GgmlType::Q8_0);
  std::vector<uint8_t> bytes(lode::row_bytes(GgmlType::Q8_0, int64_t(x.size())));
  std::vector<float> back(x.size());
  q8.quantize(x.data(), bytes.data(), int64_t(x.size()));
  q8.dequantize(bytes.data(), back.data(), int64_t(x.size()));
  int differ = 0;
  for (size_t i = 0; i < x.size(); ++i) differ += out[i] != back[i];
  EXPECT_LE(differ, 1);
}

TEST(ActivationRounding, Q8_KBlocksOf256WithAFloatScale) {
  std::mt19937 rng(2);
  const auto x = random_row(512, rng);
  std::vector<float> out(x.size());
  lode::cpu::round_activations(GgmlType::Q4_K, x.data(), out.data(), int64_t(x.size()));
  expect_blocks(x, out, 256, false);
  // An all-zero block stays zero; a row that is not whole blocks is refused.
  std::vector<float> zeros(256, 0.0f), z(256, 1.0f);
  lode::cpu::round_activations(GgmlType::Q6_K, zeros.data(), z.data(), 256);
  EXPECT_EQ(z, zeros);
  EXPECT_THROW(lode::cpu::round_activations(GgmlType::Q4_K, x.data(), out.data(), 100), lode::Error);
}

TEST(ActivationRounding, HalfWeightsRoundToTheirFormat) {
  const std::vector<float> x = {1.0f / 3.0f, 1e-3f, 65504.0f, -2.7182818f};
  std::vector<float> out(x.size());
  lode::cpu::round_activations(GgmlType::F16, x.data(), out.data(), 4);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(out[i], lode::fp16_to_fp32(lode::fp32_to_fp16(x[i])));
  lode::cpu::round_activations(GgmlType::BF16, x.data(), out.data(), 4);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(out[i], lode::bf16_to_fp32(lode::fp32_to_bf16(x[i])));
}

// matmul with Activations::q8 is matmul in float32 on the rounded rows, bit for bit; F32 weights
// leave the activations alone.
TEST(ActivationRounding, MatmulRoundsEachActivationRow) {
  std::mt19937 rng(3);
  const int64_t rows = 16, cols = 256, T = 3;
  std::vector<float> w(size_t(rows * cols)), x(size_t(T * cols));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : w) v = normal(rng);
  for (float& v : x) v = normal(rng);
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F32}) {
    const auto& traits = lode::traits(type);
    const size_t rb = lode::row_bytes(type, cols);
    std::vector<uint8_t> q(rb * size_t(rows));
    for (int64_t r = 0; r < rows; ++r) traits.quantize(w.data() + r * cols, q.data() + r * rb, cols);
    const lode::model::MatrixView view{&traits, q.data(), cols, rows, rb};
    std::vector<float> rounded(x.size());
    for (int64_t t = 0; t < T; ++t)
      lode::cpu::round_activations(type, x.data() + t * cols, rounded.data() + t * cols, cols);
    std::vector<float> got(size_t(T * rows)), want(got.size()), plain(got.size());
    lode::cpu::matmul(view, x.data(), got.data(), T, {.threads = 2, .activations = lode::model::Activations::q8});
    lode::cpu::matmul(view, rounded.data(), want.data(), T, {.threads = 1});
    lode::cpu::matmul(view, x.data(), plain.data(), T, {.threads = 1});
    EXPECT_EQ(got, want) << traits.name;
    if (type == GgmlType::F32) EXPECT_EQ(got, plain);
    else EXPECT_NE(got, plain) << traits.name;
  }
}

}  // namespace
