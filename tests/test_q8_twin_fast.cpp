// The fast q8 twin kernels (cpu/q8_twin_avx2.cpp) against the reference they must match bit for
// bit (q8twin::row_dot): every type they cover, row lengths of every lane count, and weights and x
// chosen to reach the corners (extreme quants, zero and huge scales, zero x, outliers, SwiGLU x).
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/types.h"
#include "core/host_isa.h"
#include "cpu/q8_twin.h"
#include "cpu/q8_twin_fast.h"
#include "support/random.h"

namespace {

using lode::GgmlType;
namespace twin = lode::cpu::q8twin;

using lode::host_has_avx2;  // (what the kernels ask for)

constexpr GgmlType kFastTypes[] = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0};

// Row lengths for a type: every lane count (8, 16 and 32 lanes; odd numbers of blocks) and the
// model's shapes; Q8_0 both its slice form and its span form (multiples of 256, up to 64 spans).
std::vector<int64_t> cols_for(GgmlType type) {
  if (type == GgmlType::Q8_0)
    return {32, 64, 96, 128, 160, 224, 288, 800, 2880, 256, 512, 768, 1280, 2048, 4096, 16384, 16640};
  return {256, 512, 768, 1280, 1792, 2048, 4096};
}

// Byte offsets of a block's fp16 scales.
std::vector<size_t> half_offsets(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q6_K: return {offsetof(lode::quant::BlockQ6_K, d)};
    default: return {0};
  }
}

// An fp16 scale: mostly ordinary, sometimes zero, negative zero, subnormal, the largest finite or
// infinite (NaN products then come out alike too: x86 makes one NaN, and it propagates).
uint16_t random_half(std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, 39);
  switch (pick(rng)) {
    case 0: return 0x0000;
    case 1: return 0x8000;
    case 2: return uint16_t(std::uniform_int_distribution<int>(1, 0x3ff)(rng));  // subnormal
    case 3: return 0x7bff;                                                          // 65504
    case 4: return 0xfbff;
    case 5: return 0x7c00;                                                          // infinity
    default: return lode::fp32_to_fp16(lode::test::normal_floats(1, rng, 0.01f)[0]);
  }
}

// Kinds of weight rows.
enum class Weights { quantized, random_bytes, all_ones, all_zero };

std::vector<uint8_t> make_rows(GgmlType type, Weights kind, int64_t rows, int64_t cols, size_t stride,
                               std::mt19937& rng) {
  const lode::TypeTraits& t = lode::traits(type);
  const size_t row_bytes = lode::row_bytes(type, cols);
  std::vector<uint8_t> w(stride * size_t(rows), 0xa5);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data() + size_t(r) * stride;
    if (kind == Weights::quantized) {
      const std::vector<float> v = lode::test::normal_floats(size_t(cols), rng, 0.05f, r % 3 == 0 ? 0.02f : 0.0f);
      t.quantize(v.data(), row, cols);
      continue;
    }
    for (size_t i = 0; i < row_bytes; ++i)
      row[i] = kind == Weights::random_bytes ? uint8_t(byte(rng)) : kind == Weights::all_ones ? 0xff : 0x00;
    if (kind == Weights::all_zero) continue;
    for (int64_t b = 0; b < cols / t.block_size; ++b)  // finite scales (all ones would be NaN)
      for (size_t at : half_offsets(type)) {
        const uint16_t h = kind == Weights::all_ones ? 0x3c00 : random_half(rng);
        std::memcpy(row + size_t(b) * t.block_bytes + at, &h, 2);
      }
  }
  return w;
}

// Kinds of x.
enum class Input { normal, zero, outliers, enormous, constant, swiglu };

void make_x(GgmlType type, Input kind, int64_t cols, std::mt19937& rng, const twin::RoundedBuffer& out) {
  std::vector<float> x = lode::test::normal_floats(size_t(cols), rng, 1.5f);
  if (kind == Input::swiglu) {
    const std::vector<float> up = lode::test::normal_floats(size_t(cols), rng, 1.0f);
    twin::round(type, x.data(), up.data(), cols, out.x());
    return;
  }
  for (int64_t c = 0; c < cols; ++c) {
    float& v = x[size_t(c)];
    if (kind == Input::zero) v = 0.0f;
    if (kind == Input::constant) v = c % 64 < 32 ? 3.0f : -3.0f;                  // every q at +-127
    if (kind == Input::outliers && c % 97 == 5) v = c % 2 ? 1e30f : -3e29f;       // the rest round to 0
    if (kind == Input::enormous && c % 41 == 7) v = c % 2 ? 3e38f : -2e38f;       // d * x.d overflows
  }
  twin::round(type, x.data(), nullptr, cols, out.x());
}

// The rows whose fast product differs from row_dot's in any bit, described for the failure message.
std::string mismatches(GgmlType type, const std::vector<uint8_t>& w, size_t stride, int64_t rows, int64_t cols,
                       const twin::RoundedX& x) {
  std::vector<float> y(size_t(rows) + 1, -1.0f);
  twin::rows(type, w.data(), stride, rows, cols, x, y.data());
  std::string out;
  for (int64_t r = 0; r < rows; ++r) {
    const float want = twin::row_dot(type, w.data() + size_t(r) * stride, cols, x);
    const uint32_t got_bits = std::bit_cast<uint32_t>(y[size_t(r)]), want_bits = std::bit_cast<uint32_t>(want);
    if (got_bits != want_bits && out.size() < 400)
      out += " row " + std::to_string(r) + ": " + std::to_string(y[size_t(r)]) + " != " + std::to_string(want) + ";";
  }
  if (std::bit_cast<uint32_t>(y[size_t(rows)]) != std::bit_cast<uint32_t>(-1.0f)) out += " wrote past the last row;";
  return out;
}

TEST(Q8TwinFast, CoveredTypesUseTheAvx2Kernels) {
  if (!host_has_avx2()) GTEST_SKIP() << "no AVX2 on this host";
  for (GgmlType type : kFastTypes) {
    EXPECT_STREQ(twin::kernel_name(type), "avx2") << lode::traits(type).name;
    for (int64_t cols : cols_for(type)) {
      const bool covered = cols >= 64;  // a Q8_0 row of one block has 4 lanes: row_dot computes it
      EXPECT_EQ(lode::cpu::q8twin::fast::kernel_for(type, cols) != nullptr, covered)
          << lode::traits(type).name << " cols " << cols;
    }
  }
  EXPECT_EQ(lode::cpu::q8twin::fast::kernel_for(GgmlType::Q4_K, 128), nullptr);  // not whole super-blocks
  EXPECT_EQ(lode::cpu::q8twin::fast::kernel_for(GgmlType::Q4_0, 256), nullptr);  // no twin at all
}

// Every combination of weights and x, for every covered type and row length, with rows padded
// apart so that the kernels must use the stride.
TEST(Q8TwinFast, SameBitsAsTheReference) {
  std::mt19937 rng(2024);
  for (GgmlType type : kFastTypes) {
    for (int64_t cols : cols_for(type)) {
      const int64_t rows = 13;
      const size_t stride = lode::row_bytes(type, cols) + (cols % 512 == 0 ? 0 : 18);
      for (Weights wk : {Weights::quantized, Weights::random_bytes, Weights::all_ones, Weights::all_zero}) {
        const std::vector<uint8_t> w = make_rows(type, wk, rows, cols, stride, rng);
        for (Input xk :
             {Input::normal, Input::zero, Input::outliers, Input::enormous, Input::constant, Input::swiglu}) {
          twin::RoundedBuffer r(cols);
          make_x(type, xk, cols, rng, r);
          EXPECT_EQ(mismatches(type, w, stride, rows, cols, r.x()), "")
              << lode::traits(type).name << " cols " << cols << " weights " << int(wk) << " x " << int(xk);
        }
      }
    }
  }
}

// Many random rows of the model's shapes: Q4_K gate/up rows of 2048 values, Q5_K down rows of 512,
// and the other types at both.
TEST(Q8TwinFast, SameBitsOnManyRandomRows) {
  std::mt19937 rng(77);
  for (GgmlType type : kFastTypes) {
    for (int64_t cols : {512, 2048}) {
      const int64_t rows = 200;
      const size_t stride = lode::row_bytes(type, cols);
      for (Weights wk : {Weights::quantized, Weights::random_bytes}) {
        const std::vector<uint8_t> w = make_rows(type, wk, rows, cols, stride, rng);
        twin::RoundedBuffer r(cols);
        make_x(type, Input::swiglu, cols, rng, r);
        EXPECT_EQ(mismatches(type, w, stride, rows, cols, r.x()), "") << lode::traits(type).name << " cols " << cols;
      }
    }
  }
}

// A product whose lanes and butterfly order matter: if the kernel summed the slices in another
// order, rows of values that cancel (large +- pairs and small values) would come out different.
TEST(Q8TwinFast, SameBitsWhereSummationOrderMatters) {
  std::mt19937 rng(5);
  for (GgmlType type : kFastTypes) {
    const int64_t cols = 4096, rows = 64;
    const size_t stride = lode::row_bytes(type, cols);
    std::vector<uint8_t> w(stride * rows);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> v = lode::test::normal_floats(size_t(cols), rng, 1e-3f);
      for (int64_t c = 0; c < cols; c += 256) v[size_t(c + r % 256)] = (c / 256) % 2 ? 40.0f : -40.0f;
      lode::traits(type).quantize(v.data(), w.data() + size_t(r) * stride, cols);
    }
    twin::RoundedBuffer x(cols);
    make_x(type, Input::normal, cols, rng, x);
    EXPECT_EQ(mismatches(type, w, stride, rows, cols, x.x()), "") << lode::traits(type).name;
  }
}

}  // namespace
