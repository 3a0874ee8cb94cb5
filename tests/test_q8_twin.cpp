// The host twin of the GPU's 8-bit-activation products (cpu/q8_twin.h): its rounding of x is the
// Q8_0 / Q8_K rounding, its products are the dequantized dot products of rounded x up to float
// summation order, and the fast kernels give its bits exactly. (That its bits are the GPU's is
// checked on the GPU: tests/test_cuda_experts.cpp, the CPU miss path.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/exact_math.h"
#include "core/quant/types.h"
#include "cpu/activation_rounding.h"
#include "cpu/q8_twin.h"
#include "support/random.h"

namespace {

using lode::GgmlType;
namespace twin = lode::cpu::q8twin;

constexpr GgmlType kTypes[] = {GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// The rounded values as floats: d * q.
std::vector<float> values(const twin::RoundedX& x, int64_t cols) {
  std::vector<float> v(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) v[size_t(c)] = x.d[c / 32] * float(x.q[c]);
  return v;
}

std::vector<uint8_t> quantized_rows(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t row_bytes = lode::row_bytes(type, cols);
  std::vector<uint8_t> w(row_bytes * size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> v = lode::test::normal_floats(size_t(cols), rng, 0.05f);
    lode::traits(type).quantize(v.data(), w.data() + size_t(r) * row_bytes, cols);
  }
  return w;
}

TEST(Q8Twin, RoundingIsTheCpuEnginesActivationRounding) {
  std::mt19937 rng(11);
  for (GgmlType type : kTypes) {
    for (int64_t cols : {256, 512, 2048}) {
      const std::vector<float> x = lode::test::normal_floats(size_t(cols), rng, 2.0f);
      twin::RoundedBuffer r(cols);
      twin::round(type, x.data(), nullptr, cols, r.x());
      std::vector<float> engine(static_cast<size_t>(cols));
      lode::cpu::round_activations(type, x.data(), engine.data(), cols);
      const std::vector<float> mine = values(r.x(), cols);
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(mine[size_t(c)], engine[size_t(c)]) << lode::traits(type).name << " cols " << cols << " at " << c;
      for (int64_t s = 0; s < cols / 16; ++s) {
        int sum = 0;
        for (int i = 0; i < 16; ++i) sum += r.x().q[16 * s + i];
        ASSERT_EQ(r.x().sum16[s], sum);
      }
    }
  }
}

TEST(Q8Twin, SwigluInputRoundsTheSwigluValues) {
  std::mt19937 rng(12);
  const int64_t cols = 512;
  const std::vector<float> g = lode::test::normal_floats(size_t(cols), rng, 3.0f);
  const std::vector<float> u = lode::test::normal_floats(size_t(cols), rng, 1.0f);
  std::vector<float> h(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    h[size_t(c)] = lode::exact::swiglu(g[size_t(c)], u[size_t(c)]);
    const double silu = double(g[size_t(c)]) / (1.0 + std::exp(-double(g[size_t(c)])));
    ASSERT_NEAR(h[size_t(c)], silu * u[size_t(c)], 1e-6 * (1.0 + std::fabs(silu * u[size_t(c)])));
  }
  twin::RoundedBuffer a(cols), b(cols);
  twin::round(GgmlType::Q5_K, g.data(), u.data(), cols, a.x());
  twin::round(GgmlType::Q5_K, h.data(), nullptr, cols, b.x());
  EXPECT_EQ(values(a.x(), cols), values(b.x(), cols));
}

TEST(Q8Twin, ExpForSigmoidIsCloseToExp) {
  for (float x = -80.0f; x <= 88.0f; x += 0.0371f) {
    const double want = std::exp(double(x));
    ASSERT_NEAR(lode::exact::exp_for_sigmoid(x) / want, 1.0, 4e-7) << x;
  }
  EXPECT_EQ(lode::exact::exp_for_sigmoid(-100.0f), 0.0f);
  EXPECT_TRUE(std::isinf(lode::exact::exp_for_sigmoid(100.0f)));
  EXPECT_EQ(lode::exact::swiglu(-200.0f, 1.0f), 0.0f);
  EXPECT_EQ(lode::exact::swiglu(200.0f, 2.0f), 400.0f);
}

// Each product is the float dot product of the dequantized row with rounded x, up to summation order.
TEST(Q8Twin, ProductsAreDotProductsOfTheRoundedValues) {
  std::mt19937 rng(13);
  for (GgmlType type : kTypes) {
    for (int64_t cols : {64, 256, 512, 2048}) {
      if (cols % lode::traits(type).block_size != 0) continue;
      const int64_t rows = 24;
      const std::vector<uint8_t> w = quantized_rows(type, rows, cols, rng);
      const size_t row_bytes = lode::row_bytes(type, cols);
      const std::vector<float> x = lode::test::normal_floats(size_t(cols), rng);
      twin::RoundedBuffer r(cols);
      twin::round(type, x.data(), nullptr, cols, r.x());
      const std::vector<float> xv = values(r.x(), cols);
      std::vector<float> y(static_cast<size_t>(rows)), row(static_cast<size_t>(cols));
      twin::rows(type, w.data(), row_bytes, rows, cols, r.x(), y.data());
      for (int64_t i = 0; i < rows; ++i) {
        lode::traits(type).dequantize(w.data() + size_t(i) * row_bytes, row.data(), cols);
        double want = 0.0, scale = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
          want += double(row[size_t(c)]) * double(xv[size_t(c)]);
          scale += std::fabs(double(row[size_t(c)]) * double(xv[size_t(c)]));
        }
        ASSERT_NEAR(y[size_t(i)], want, 1e-5 * scale + 1e-7) << lode::traits(type).name << " cols " << cols << " row " << i;
        ASSERT_EQ(y[size_t(i)], twin::row_dot(type, w.data() + size_t(i) * row_bytes, cols, r.x()));
      }
    }
  }
}

}  // namespace
