// The CUDA backend's first pieces (issue 7) against the CPU engine: quantized matrix-vector
// products for every type with a kernel, and the VRAM accountant's budget. Skip without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/quant/types.h"
#include "cpu/matmul.h"
#include "support/gpu.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/matvec.h"
#include "cuda/vram.h"

namespace {

using lode::GgmlType;

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// The same product on the GPU and on the CPU (which reads every type exactly as ggml does): equal
// up to float summation order.
TEST(CudaMatvec, EveryKernelTypeMatchesTheCpu) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram;
  std::mt19937 rng(11);
  const int64_t rows = 67, cols = 512, tokens = 3;
  const auto values = random_floats(size_t(rows * cols), rng);
  const auto x = random_floats(size_t(tokens * cols), rng);
  lode::cuda::DeviceBuffer dx(vram, x.size() * 4, lode::cuda::VramUse::scratch, "x");
  lode::cuda::copy_to_device(dx.data(), x.data(), x.size() * 4);
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                        GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const auto& traits = lode::traits(type);
    SCOPED_TRACE(traits.name);
    ASSERT_TRUE(lode::cuda::has_matvec(type));
    const size_t row_bytes = lode::row_bytes(type, cols);
    std::vector<uint8_t> w(row_bytes * size_t(rows));
    for (int64_t r = 0; r < rows; ++r) traits.quantize(values.data() + r * cols, w.data() + r * row_bytes, cols);
    std::vector<float> want(size_t(tokens * rows)), got(want.size());
    lode::cpu::matmul({&traits, w.data(), cols, rows, row_bytes}, x.data(), want.data(), tokens, {.threads = 1});

    lode::cuda::DeviceBuffer dw(vram, w.size(), lode::cuda::VramUse::weights, "w");
    lode::cuda::DeviceBuffer dy(vram, got.size() * 4, lode::cuda::VramUse::scratch, "y");
    lode::cuda::copy_to_device(dw.data(), w.data(), w.size());
    lode::cuda::matvec(type, dw.data(), rows, cols, row_bytes, dx.as<float>(), dy.as<float>(), tokens);
    lode::cuda::synchronize();
    lode::cuda::copy_to_host(got.data(), dy.data(), got.size() * 4);
    double scale = 0, diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      scale = std::max(scale, double(std::fabs(want[i])));
      diff = std::max(diff, double(std::fabs(got[i] - want[i])));
    }
    EXPECT_LE(diff / scale, 2e-6) << "max |gpu - cpu| " << diff << " of " << scale;
  }
}

TEST(CudaMatvec, TypesWithoutAKernelAreRefusedClearly) {
  LODE_REQUIRE_GPU();
  EXPECT_FALSE(lode::cuda::has_matvec(GgmlType::IQ1_S));
  try {
    lode::cuda::matvec(GgmlType::IQ1_S, nullptr, 1, 256, 50, nullptr, nullptr, 1);
    FAIL() << "no error";
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no kernel for iq1_s"), std::string::npos) << e.what();
  }
}

TEST(CudaVram, TheBudgetIsKeptAndShortfallsAreNamed) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram(size_t(64) << 20);
  EXPECT_EQ(vram.budget(), size_t(64) << 20);
  {
    lode::cuda::DeviceBuffer weights(vram, size_t(48) << 20, lode::cuda::VramUse::weights, "blk.0 experts");
    EXPECT_EQ(vram.held(lode::cuda::VramUse::weights), size_t(48) << 20);
    try {
      lode::cuda::DeviceBuffer kv(vram, size_t(32) << 20, lode::cuda::VramUse::kv, "K/V cache");
      FAIL() << "over the budget, no error";
    } catch (const lode::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("K/V cache (kv) needs 32.0 MiB"), std::string::npos) << m;
      EXPECT_NE(m.find("short by 16.0 MiB"), std::string::npos) << m;
      EXPECT_NE(m.find("weights 48.0 MiB"), std::string::npos) << m;
    }
    EXPECT_EQ(vram.held(), size_t(48) << 20);
  }
  EXPECT_EQ(vram.held(), 0u);
  EXPECT_EQ(vram.peak(), size_t(48) << 20);
}

}  // namespace

#else

TEST(CudaMatvec, NeedsACudaBuild) { GTEST_SKIP() << "lode was built without CUDA (LODE_CUDA=OFF or no nvcc)"; }

#endif
