// The decode step's fused kernels (cuda/forward_kernels.h), and the prompt pass's DeltaNet scan,
// one by one against the CPU operations they fuse (cpu/ops.h, cpu/moe.h, cpu/deltanet.h), on
// random data in the 35B-A3B's shapes, so a kernel that drifts is named here and not only through
// a whole model's logits. Float sums run in another order on the GPU: values agree to a few
// float32 roundings of their magnitude, and what is chosen (the router's experts, their order)
// agrees exactly. Skip without a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/deltanet.h"
#include "cpu/moe.h"
#include "cpu/ops.h"
#include "plan/scratch.h"
#include "sample/sampler.h"
#include "support/gpu.h"
#include "support/naive_math.h"
#include "support/random.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/forward_kernels.h"
#include "cuda/prompt_kernels.h"
#include "cuda/vram.h"

namespace {

using lode::test::normal_floats;

// Host vectors in and out of device buffers of one test.
class Device {
 public:
  template <class T>
  T* upload(const std::vector<T>& host) {
    buffers_.emplace_back(vram_, std::max<size_t>(host.size() * sizeof(T), 4), lode::cuda::VramUse::scratch, "test");
    lode::cuda::copy_to_device(buffers_.back().data(), host.data(), host.size() * sizeof(T));
    return buffers_.back().as<T>();
  }
  template <class T>
  T* zeros(size_t n) {
    return upload(std::vector<T>(n, T{}));
  }
  template <class T>
  std::vector<T> download(const T* device, size_t n) {
    lode::cuda::synchronize();
    std::vector<T> host(n);
    lode::cuda::copy_to_host(host.data(), device, n * sizeof(T));
    return host;
  }

 private:
  lode::cuda::VramAccountant vram_;
  std::vector<lode::cuda::DeviceBuffer> buffers_;
};

constexpr int kHidden = 2048, kExperts = 256, kUsed = 8;
constexpr float kEps = 1e-6f;

// rms_norm on three rows; add_rms_norm's residual add (one float addition: the same bits) and the
// norm after it, for rows of 2048 values and of widths that give its kernel 1, 4 and 8 values a
// thread (a row that does not fill the block's last pass among them).
TEST(CudaKernels, NormsMatchTheCpu) {
  LODE_REQUIRE_GPU();
  std::mt19937 rng(1);
  constexpr int kRows = 3;
  for (const int n : {kHidden, 1000, 3000, 8192}) {
    SCOPED_TRACE(n);
    const auto x = normal_floats(size_t(kRows) * n, rng), w = normal_floats(n, rng, 0.1f, 1.0f);
    const auto d = normal_floats(size_t(kRows) * n, rng);
    Device dev;
    float *dx = dev.upload(x), *dw = dev.upload(w), *dd = dev.upload(d), *out = dev.zeros<float>(x.size());
    ASSERT_EQ(lode::cuda::kernels::rms_norm(dx, dw, out, kRows, n, kEps, nullptr), nullptr);
    std::vector<float> want(x.size());
    for (int r = 0; r < kRows; ++r) lode::cpu::rms_norm(&x[size_t(r) * n], w.data(), &want[size_t(r) * n], n, kEps);
    EXPECT_LT(lode::test::relative_error(dev.download(out, x.size()), want), 1e-5);

    ASSERT_EQ(lode::cuda::kernels::add_rms_norm(dx, dd, dw, out, kRows, n, kEps, nullptr), nullptr);
    std::vector<float> h(x.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = x[i] + d[i];
    for (int r = 0; r < kRows; ++r) lode::cpu::rms_norm(&h[size_t(r) * n], w.data(), &want[size_t(r) * n], n, kEps);
    EXPECT_EQ(dev.download(dx, h.size()), h);
    EXPECT_LT(lode::test::relative_error(dev.download(out, x.size()), want), 1e-5);
  }
}

// The router's float32 product (with the shared expert's gate as row 256) and its top 8 in one
// launch: the logits within float32 rounding of float64 sums, then exactly cpu::route's choice
// on those logits, each choice counted in the tally (misses: the choices not resident). Rows of
// 2048 values (one pass of a lane's loads) and 2560 (two).
TEST(CudaKernels, TheRouterAndItsTopKMatchTheCpu) {
  LODE_REQUIRE_GPU();
  std::mt19937 rng(2);
  constexpr int kRows = kExperts + 1;
  for (const int cols : {kHidden, 2560}) {  // one pass of a lane's loads, and two
    SCOPED_TRACE(cols);
    const auto w = normal_floats(size_t(kRows) * cols, rng, 0.05f), x = normal_floats(cols, rng);
    std::vector<uint8_t> resident(kExperts);
    for (int e = 0; e < kExperts; ++e) resident[size_t(e)] = uint8_t(e % 3 != 0);
    Device dev;
    float *logits = dev.zeros<float>(kRows), *weights = dev.zeros<float>(kUsed);
    int32_t* ids = dev.zeros<int32_t>(2 * kUsed);
    unsigned *counts = dev.zeros<unsigned>(kExperts), *misses = dev.zeros<unsigned>(1);
    unsigned* arrivals = dev.zeros<unsigned>(1);
    const lode::cuda::RouteTally tally{counts, dev.upload(resident), misses};
    for (int step = 0; step < 2; ++step)  // the second launch finds its arrival counter reset
      ASSERT_EQ(lode::cuda::kernels::router_topk(dev.upload(w), kRows, cols, dev.upload(x), logits, kExperts, kUsed,
                                                 ids, weights, tally, arrivals, nullptr),
                nullptr);
    const std::vector<float> got_logits = dev.download(logits, kRows);
    for (int r = 0; r < kRows; ++r) {
      double want = 0, magnitude = 0;
      for (int i = 0; i < cols; ++i) {
        want += double(w[size_t(r) * cols + i]) * x[size_t(i)];
        magnitude += std::fabs(double(w[size_t(r) * cols + i]) * x[size_t(i)]);
      }
      ASSERT_NEAR(got_logits[size_t(r)], want, 1e-5 * magnitude) << "row " << r;
    }
    const lode::cpu::Route want = lode::cpu::route(got_logits.data(), kExperts, kUsed);
    const std::vector<int32_t> got_ids = dev.download(ids, 2 * kUsed);
    const std::vector<float> got_weights = dev.download(weights, kUsed);
    const std::vector<unsigned> got_counts = dev.download(counts, kExperts);
    unsigned want_misses = 0;
    for (int j = 0; j < kUsed; ++j) {
      EXPECT_EQ(got_ids[size_t(j)], want.experts[size_t(j)]) << "slot " << j;
      EXPECT_EQ(got_ids[size_t(kUsed + j)], want.experts[size_t(j)] + kExperts) << "slot " << j;
      EXPECT_NEAR(got_weights[size_t(j)], want.weights[size_t(j)], 1e-6) << "slot " << j;
      EXPECT_EQ(got_counts[size_t(want.experts[size_t(j)])], 2u) << "expert " << want.experts[size_t(j)];
      want_misses += 2 * (resident[size_t(want.experts[size_t(j)])] == 0);
    }
    unsigned counted = 0;
    for (unsigned c : got_counts) counted += c;
    EXPECT_EQ(counted, 2u * kUsed);
    EXPECT_EQ(dev.download(misses, 1)[0], want_misses);
  }
}

// moe_route on given logits, one block per token: cpu::route's experts in its order, ties (equal
// logits) to the lower index, in every token.
TEST(CudaKernels, RoutingGivenLogitsMatchesTheCpuTiesIncluded) {
  LODE_REQUIRE_GPU();
  std::mt19937 rng(3);
  constexpr int kTokens = 5;
  std::vector<float> logits = normal_floats(size_t(kTokens) * kExperts, rng, 2.0f);
  for (int e = 0; e < 12; ++e) logits[size_t(kExperts + 40 + 7 * e)] = 9.0f;  // token 1: twelve equal at the top
  Device dev;
  int32_t* ids = dev.zeros<int32_t>(size_t(kTokens) * 2 * kUsed);
  float* weights = dev.zeros<float>(size_t(kTokens) * kUsed);
  ASSERT_EQ(lode::cuda::kernels::moe_route(dev.upload(logits), kExperts, kUsed, kTokens, ids, weights,
                                           lode::cuda::RouteTally{}, nullptr),
            nullptr);
  const std::vector<int32_t> got_ids = dev.download(ids, size_t(kTokens) * 2 * kUsed);
  const std::vector<float> got_weights = dev.download(weights, size_t(kTokens) * kUsed);
  for (int t = 0; t < kTokens; ++t) {
    const lode::cpu::Route want = lode::cpu::route(&logits[size_t(t) * kExperts], kExperts, kUsed);
    for (int j = 0; j < kUsed; ++j) {
      EXPECT_EQ(got_ids[size_t(t * 2 * kUsed + j)], want.experts[size_t(j)]) << "token " << t << " slot " << j;
      EXPECT_NEAR(got_weights[size_t(t * kUsed + j)], want.weights[size_t(j)], 1e-6) << "token " << t;
    }
  }
  EXPECT_EQ(got_ids[size_t(2 * kUsed)], 40);  // token 1's first pick: the lowest of the equal ones
}

// The routed experts' weighted sum in slot order, plus the shared expert through its sigmoid
// gate, added to the residual, then the next norm: moe_forward's combine and cpu::rms_norm.
// Also without the shared expert and without the norm; and for rows and expert counts that give
// the kernel 1, 4 and 8 values a thread and experts beyond one load of them (10 of 8, 3 of 2).
TEST(CudaKernels, TheExpertSumResidualAndNormMatchTheCpu) {
  LODE_REQUIRE_GPU();
  std::mt19937 rng(4);
  struct Shape {
    int n, k;
  };
  for (const Shape shape : {Shape{kHidden, kUsed}, Shape{kHidden, 10}, Shape{1000, kUsed}, Shape{3000, 5},
                            Shape{8192, 3}}) {
    const int n = shape.n, k = shape.k;
    const auto y = normal_floats(size_t(k) * n, rng), shared = normal_floats(n, rng);
    const auto h = normal_floats(n, rng), norm_w = normal_floats(n, rng, 0.1f, 1.0f);
    std::vector<float> weights = normal_floats(k, rng, 0.05f, 0.125f);
    const float shared_logit = 0.3f;
    for (const bool with_shared : {true, false}) {
      SCOPED_TRACE(std::to_string(n) + " values, " + std::to_string(k) + " experts, " +
                   (with_shared ? "with the shared expert and the norm" : "routed experts alone, no norm"));
      Device dev;
      float *dh = dev.upload(h), *normed = dev.zeros<float>(n);
      ASSERT_EQ(lode::cuda::kernels::moe_combine_add_norm(
                    dev.upload(y), dev.upload(weights), k, with_shared ? dev.upload(shared) : nullptr,
                    dev.upload(std::vector<float>{shared_logit}), n, dh, with_shared ? dev.upload(norm_w) : nullptr,
                    normed, kEps, nullptr),
                nullptr);
      std::vector<float> want_h(n), want_normed(n);
      for (int i = 0; i < n; ++i) {
        float o = 0.0f;
        for (int j = 0; j < k; ++j) o += weights[size_t(j)] * y[size_t(j) * n + i];
        if (with_shared) o += lode::cpu::sigmoid(shared_logit) * shared[size_t(i)];
        want_h[size_t(i)] = h[size_t(i)] + o;
      }
      EXPECT_LT(lode::test::relative_error(dev.download(dh, n), want_h), 1e-6);
      if (!with_shared) continue;
      lode::cpu::rms_norm(want_h.data(), norm_w.data(), want_normed.data(), n, kEps);
      EXPECT_LT(lode::test::relative_error(dev.download(normed, n), want_normed), 1e-5);
    }
  }
}

// The 35B's DeltaNet geometry: 16 key heads and 32 value heads of 128, a conv of 4.
constexpr int kKeyHeads = 16, kValueHeads = 32, kDk = 128, kDv = 128, kConv = 4;
constexpr int kKeyDim = kKeyHeads * kDk, kChannels = 2 * kKeyDim + kValueHeads * kDv;

// deltanet_prepare: cpu::deltanet_conv_step (its state shift exactly), then the q and k heads'
// L2 norms (q also scaled by 1/sqrt(dk)) with cpu::l2_norm.
TEST(CudaKernels, TheDeltaNetConvAndNormsMatchTheCpu) {
  LODE_REQUIRE_GPU();
  std::mt19937 rng(5);
  std::vector<float> qkv = normal_floats(kChannels, rng), state = normal_floats(size_t(kChannels) * (kConv - 1), rng);
  const auto conv_w = normal_floats(size_t(kChannels) * kConv, rng, 0.5f);
  Device dev;
  float *dqkv = dev.upload(qkv), *dstate = dev.upload(state);
  ASSERT_EQ(lode::cuda::kernels::deltanet_prepare(dqkv, dstate, dev.upload(conv_w), kChannels, kConv, kKeyHeads, kDk,
                                                  nullptr),
            nullptr);
  lode::cpu::deltanet_conv_step(conv_w.data(), state.data(), qkv.data(), kChannels, kConv);
  for (int head = 0; head < 2 * kKeyHeads; ++head) {
    float* v = &qkv[size_t(head) * kDk];
    lode::cpu::l2_norm(v, kDk, 1e-6f);
    if (head < kKeyHeads)
      for (int i = 0; i < kDk; ++i) v[i] *= 1.0f / std::sqrt(float(kDk));
  }
  EXPECT_EQ(dev.download(dstate, state.size()), state);
  // Each part against its own scale: q (normed and scaled), k (normed), v (the conv's output).
  const std::vector<float> got = dev.download(dqkv, qkv.size());
  const auto part = [](const std::vector<float>& all, size_t begin, size_t end) {
    return std::vector<float>(all.begin() + std::ptrdiff_t(begin), all.begin() + std::ptrdiff_t(end));
  };
  for (const auto& [begin, end] : {std::pair<size_t, size_t>{0, kKeyDim}, {kKeyDim, 2 * kKeyDim},
                                   {2 * kKeyDim, kChannels}})
    EXPECT_LT(lode::test::relative_error(part(got, begin, end), part(qkv, begin, end)), 1e-5) << "channels " << begin;
}

// One token of the CPU's delta rule over every value head: per value head s (key head s % 16),
// beta = sigmoid(b), g = a softplus(alpha + dt_bias), cpu::deltanet_head_step on state [hv][dk][dv];
// row: the token's qkv; b, alpha: its [hv]; o [hv][dv] (before the gated norm).
void cpu_delta_rule(std::vector<float>& state, const float* row, const float* b, const float* alpha,
                    const std::vector<float>& a, const std::vector<float>& dt_bias, float* o) {
  for (int s = 0; s < kValueHeads; ++s) {
    const float beta = lode::cpu::sigmoid(b[s]);
    const float g = a[size_t(s)] * lode::cpu::softplus(alpha[s] + dt_bias[size_t(s)]);
    const size_t key = size_t(s % kKeyHeads) * kDk;
    lode::cpu::deltanet_head_step(&state[size_t(s) * kDk * kDv], row + key, row + kKeyDim + key,
                                  row + 2 * kKeyDim + size_t(s) * kDv, g, beta, kDk, kDv, o + size_t(s) * kDv);
  }
}

// deltanet_step, two tokens from a random state: cpu_delta_rule, then the gated RMSNorm
// (cpu::rms_norm times silu(z)). The second token steps from the state the first left.
TEST(CudaKernels, TheDeltaNetStepMatchesTheCpu) {
  LODE_REQUIRE_GPU();
  std::mt19937 rng(6);
  std::vector<float> state = normal_floats(size_t(kValueHeads) * kDk * kDv, rng, 0.1f);
  const auto a = normal_floats(kValueHeads, rng, 0.5f, -1.0f), dt_bias = normal_floats(kValueHeads, rng, 0.5f);
  const auto norm_w = normal_floats(kDv, rng, 0.1f, 1.0f);
  Device dev;
  float* dstate = dev.upload(state);
  float* o = dev.zeros<float>(size_t(kValueHeads) * kDv);
  for (int token = 0; token < 2; ++token) {
    SCOPED_TRACE("token " + std::to_string(token));
    std::vector<float> qkv = normal_floats(kChannels, rng);
    for (int head = 0; head < 2 * kKeyHeads; ++head) lode::cpu::l2_norm(&qkv[size_t(head) * kDk], kDk, 1e-6f);
    const auto z = normal_floats(size_t(kValueHeads) * kDv, rng), b = normal_floats(kValueHeads, rng);
    const auto alpha = normal_floats(kValueHeads, rng);
    ASSERT_EQ(lode::cuda::kernels::deltanet_step(dstate, dev.upload(qkv), dev.upload(z), dev.upload(b),
                                                 dev.upload(alpha), dev.upload(a), dev.upload(dt_bias),
                                                 dev.upload(norm_w), kKeyHeads, kValueHeads, kDk, kDv, kEps, o,
                                                 nullptr),
              nullptr);
    std::vector<float> want(size_t(kValueHeads) * kDv), raw(want.size());
    cpu_delta_rule(state, qkv.data(), b.data(), alpha.data(), a, dt_bias, raw.data());
    for (int s = 0; s < kValueHeads; ++s) {
      float* out = &want[size_t(s) * kDv];
      lode::cpu::rms_norm(&raw[size_t(s) * kDv], norm_w.data(), out, kDv, kEps);
      for (int c = 0; c < kDv; ++c) out[c] *= lode::cpu::silu(z[size_t(s) * kDv + c]);
    }
    EXPECT_LT(lode::test::relative_error(dev.download(dstate, state.size()), state), 1e-5);
    EXPECT_LT(lode::test::relative_error(dev.download(o, want.size()), want), 1e-4);
  }
}

// A verify window of T tokens in one launch of the conv and one of the step (cuda::kernels::
// TokenRows: the rows of the stacked qkv|z|b|alpha product, [T][rows]) leaves every token's
// outputs and the final conv and DeltaNet states with the bits of T one-token launches, and keeps
// the states before each token but the first where asked (a rollback into the window).
TEST(CudaKernels, TheDeltaNetConvAndStepOverAWindowGiveEachTokensBits) {
  LODE_REQUIRE_GPU();
  constexpr int kTokens = 3;
  constexpr int64_t kRow = kChannels + kValueHeads * kDv + 2 * kValueHeads;  // qkv | z | b | alpha
  constexpr int64_t kOut = int64_t(kValueHeads) * kDv;
  std::mt19937 rng(7);
  const auto rows = normal_floats(size_t(kTokens * kRow), rng);
  const auto conv_state = normal_floats(size_t(kChannels) * (kConv - 1), rng);
  const auto ssm_state = normal_floats(size_t(kValueHeads) * kDk * kDv, rng, 0.1f);
  const auto conv_w = normal_floats(size_t(kChannels) * kConv, rng, 0.5f);
  const auto a = normal_floats(kValueHeads, rng, 0.5f, -1.0f), dt_bias = normal_floats(kValueHeads, rng, 0.5f);
  const auto norm_w = normal_floats(kDv, rng, 0.1f, 1.0f);
  Device dev;
  const float *dconv_w = dev.upload(conv_w), *da = dev.upload(a), *ddt_bias = dev.upload(dt_bias);
  const float* dnorm_w = dev.upload(norm_w);
  struct Run {
    float *rows, *conv, *ssm, *o;
  };
  const auto fresh = [&] {
    return Run{dev.upload(rows), dev.upload(conv_state), dev.upload(ssm_state), dev.zeros<float>(size_t(kTokens * kOut))};
  };
  using lode::cuda::kernels::TokenRows;
  // (conv_rows and step_rows differ only in where they keep the states before each token.)
  const auto step = [&](const Run& r, int64_t first, TokenRows conv_rows, TokenRows step_rows) {
    float* qkv = r.rows + first * kRow;
    ASSERT_EQ(lode::cuda::kernels::deltanet_prepare(qkv, r.conv, dconv_w, kChannels, kConv, kKeyHeads, kDk, nullptr,
                                                    conv_rows),
              nullptr);
    ASSERT_EQ(lode::cuda::kernels::deltanet_step(r.ssm, qkv, qkv + kChannels, qkv + kChannels + kOut,
                                                 qkv + kChannels + kOut + kValueHeads, da, ddt_bias, dnorm_w, kKeyHeads,
                                                 kValueHeads, kDk, kDv, kEps, r.o + first * kOut, nullptr, step_rows),
              nullptr);
  };
  const Run one = fresh(), window = fresh();
  std::vector<std::vector<float>> conv_before, ssm_before;  // the one-token run's states before each token
  for (int64_t t = 0; t < kTokens; ++t) {
    conv_before.push_back(dev.download(one.conv, conv_state.size()));
    ssm_before.push_back(dev.download(one.ssm, ssm_state.size()));
    step(one, t, {}, {});
  }
  const int64_t conv_n = int64_t(conv_state.size()), ssm_n = int64_t(ssm_state.size());
  // (Room for a state before each token, but only the states before the second and later ones are
  // kept, at slots 0 .. kTokens - 2: the last slot stays zero.)
  float* conv_kept = dev.zeros<float>(size_t(kTokens * conv_n));
  float* ssm_kept = dev.zeros<float>(size_t(kTokens * ssm_n));
  const TokenRows rows_of{.n = kTokens, .in_stride = kRow, .out_stride = kOut};
  TokenRows conv_rows = rows_of, step_rows = rows_of;
  conv_rows.kept = conv_kept, conv_rows.kept_stride = conv_n;
  step_rows.kept = ssm_kept, step_rows.kept_stride = ssm_n;
  step(window, 0, conv_rows, step_rows);
  EXPECT_EQ(dev.download(window.rows, rows.size()), dev.download(one.rows, rows.size())) << "conv outputs";
  EXPECT_EQ(dev.download(window.conv, conv_state.size()), dev.download(one.conv, conv_state.size())) << "conv state";
  EXPECT_EQ(dev.download(window.ssm, ssm_state.size()), dev.download(one.ssm, ssm_state.size())) << "DeltaNet state";
  EXPECT_EQ(dev.download(window.o, size_t(kTokens * kOut)), dev.download(one.o, size_t(kTokens * kOut))) << "outputs";
  for (int64_t t = 1; t < kTokens; ++t) {
    const int64_t at = t - 1;
    EXPECT_EQ(dev.download(conv_kept + at * conv_n, size_t(conv_n)), conv_before[size_t(t)]) << "conv state before " << t;
    EXPECT_EQ(dev.download(ssm_kept + at * ssm_n, size_t(ssm_n)), ssm_before[size_t(t)]) << "DeltaNet state before " << t;
  }
  const std::vector<float> conv_zeros(static_cast<size_t>(conv_n), 0.0f), ssm_zeros(static_cast<size_t>(ssm_n), 0.0f);
  EXPECT_EQ(dev.download(conv_kept + (kTokens - 1) * conv_n, size_t(conv_n)), conv_zeros) << "nothing kept past the last";
  EXPECT_EQ(dev.download(ssm_kept + (kTokens - 1) * ssm_n, size_t(ssm_n)), ssm_zeros) << "nothing kept past the last";
}

// The step refuses heads wider than its threads hold, saying so, before it queues anything (no GPU
// needed).
TEST(CudaKernels, TheDeltaNetStepRefusesHeadsItCannotHold) {
  for (const auto& [dk, dv] : {std::pair{256, 128}, {128, 256}, {128, 126}}) {
    const char* err = lode::cuda::kernels::deltanet_step(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                         nullptr, 1, 1, dk, dv, kEps, nullptr, nullptr);
    ASSERT_NE(err, nullptr) << dk << " x " << dv;
    EXPECT_NE(std::string(err).find("at most 128"), std::string::npos) << err;
  }
}

// h = silu(g) * u.
TEST(CudaKernels, SwigluMatchesTheCpu) {
  LODE_REQUIRE_GPU();
  std::mt19937 rng(7);
  const auto g = normal_floats(4096, rng, 3.0f), u = normal_floats(4096, rng);
  Device dev;
  float* h = dev.zeros<float>(g.size());
  ASSERT_EQ(lode::cuda::kernels::swiglu(dev.upload(g), dev.upload(u), h, int64_t(g.size()), nullptr), nullptr);
  std::vector<float> want(g.size());
  for (size_t i = 0; i < g.size(); ++i) want[i] = lode::cpu::silu(g[i]) * u[i];
  EXPECT_LT(lode::test::relative_error(dev.download(h, g.size()), want), 1e-6);
}

// Greedy sampling on the device over the vocabulary's size: the first of the largest logits (as
// the host's sampler picks it), with ties placed in different blocks; -1 where the sampler would
// fail (a NaN or +inf anywhere, every logit -inf); the counter left zeroed, so calls in a row on
// other logits are right too.
TEST(CudaKernels, TheGreedyTokenIsTheFirstLargestLogit) {
  LODE_REQUIRE_GPU();
  std::mt19937 rng(11);
  constexpr int kVocab = 248320, kBlocks = 128;
  std::vector<float> logits = normal_floats(kVocab, rng, 4.0f);
  // Equal tops in other blocks, and one in the same thread as the first (128 x 256 threads apart).
  for (int i : {200001, 77777, 190000, 77777 + kBlocks * 256}) logits[size_t(i)] = 40.0f;
  Device dev;
  void* partials = dev.zeros<uint64_t>(kBlocks);
  unsigned* arrivals = dev.zeros<unsigned>(1);
  int32_t* token = dev.zeros<int32_t>(1);
  const auto greedy = [&](const std::vector<float>& x) {
    EXPECT_EQ(lode::cuda::kernels::greedy_token(dev.upload(x), int(x.size()), partials, kBlocks, arrivals, token, nullptr),
              nullptr);
    return dev.download(token, 1)[0];
  };
  EXPECT_EQ(greedy(logits), 77777);
  logits[5] = 1e30f;
  EXPECT_EQ(greedy(logits), 5);
  logits[kVocab - 1] = std::nanf("");
  EXPECT_EQ(greedy(logits), -1);
  logits[kVocab - 1] = INFINITY;
  EXPECT_EQ(greedy(logits), -1);
  std::vector<float> low(1000, -INFINITY);
  low[999] = -1e30f;
  EXPECT_EQ(greedy(low), 999);
  EXPECT_EQ(greedy(std::vector<float>(300, -INFINITY)), -1);
  EXPECT_EQ(greedy(std::vector<float>(300, 2.0f)), 0);  // all equal: the first
  EXPECT_EQ(dev.download(arrivals, 1)[0], 0u);
}

// Top candidates on the device against the host's (sample::top_candidates): the same pairs, bit
// for bit, and the same count of finite logits, on rows of the vocabulary's size (64 slices) down to
// one slice, with many ties (across slices too), -0 beside +0, bans (-inf), rows with fewer finite
// logits than candidates, a row of one value, the best all in one slice, and -1 for a row with a
// NaN or +inf; several rows in one launch, each its own, and the counter left zeroed.
TEST(CudaKernels, TopCandidatesAreTheHostsTopCandidates) {
  LODE_REQUIRE_GPU();
  using lode::cuda::kernels::TopPair;
  constexpr int kK = lode::sample::kTopCandidates;
  std::mt19937 rng(13);
  for (const int n : {248320, 8192, 4096, 100, 65, 64, 1}) {
    std::vector<std::vector<float>> rows;
    rows.push_back(normal_floats(size_t(n), rng, 4.0f));
    std::vector<float> ties = normal_floats(size_t(n), rng, 2.0f);
    for (float& x : ties) x = std::round(x);  // a few values: the threshold cuts through ties
    rows.push_back(ties);
    std::vector<float> zeros(size_t(n), -1.0f);
    for (int i = 0; i < n; i += 3) zeros[size_t(i)] = i % 2 ? 0.0f : -0.0f;
    rows.push_back(zeros);
    std::vector<float> banned = normal_floats(size_t(n), rng, 1.0f);
    for (int i = 0; i < n; ++i)
      if (i % 7 != 3) banned[size_t(i)] = -INFINITY;  // n / 7 finite: fewer than 64 for the small rows
    rows.push_back(banned);
    rows.push_back(std::vector<float>(size_t(n), 0.5f));
    rows.push_back(std::vector<float>(size_t(n), -INFINITY));  // no finite logit: no candidates
    std::vector<float> clustered = normal_floats(size_t(n), rng, 1.0f);
    for (int i = n / 3; i < std::min(n, n / 3 + 200); ++i) clustered[size_t(i)] = 10.0f + float(i % 50) / 8.0f;
    rows.push_back(clustered);
    constexpr size_t kBroken = 2;  // the last rows: a NaN, a +inf (finite -1: the sampler fails)
    for (const float bad : {std::nanf(""), INFINITY}) {
      std::vector<float> broken = normal_floats(size_t(n), rng, 1.0f);
      broken[size_t(n) / 2] = bad;
      rows.push_back(broken);
    }
    std::vector<float> all;
    for (const auto& r : rows) all.insert(all.end(), r.begin(), r.end());
    Device dev;
    TopPair* out = dev.zeros<TopPair>(rows.size() * kK);
    int32_t* finite = dev.zeros<int32_t>(rows.size());
    const int slices = lode::plan::top_candidate_slices(n);
    unsigned* arrivals = dev.zeros<unsigned>(rows.size());
    const lode::cuda::kernels::TopScratch scratch{dev.zeros<TopPair>(rows.size() * slices * kK),
                                                  dev.zeros<int32_t>(rows.size() * slices * 2), arrivals, slices};
    ASSERT_EQ(lode::cuda::kernels::top_candidates(dev.upload(all), n, kK, scratch, out, finite, nullptr,
                                                  int(rows.size())),
              nullptr);
    const std::vector<TopPair> got = dev.download(out, rows.size() * kK);
    const std::vector<int32_t> counts = dev.download(finite, rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      SCOPED_TRACE(testing::Message() << "row " << r << " of " << n);
      if (r + kBroken >= rows.size()) {
        EXPECT_EQ(counts[r], -1);
        continue;
      }
      const lode::sample::TopCandidates want = lode::sample::top_candidates(rows[r], kK);
      ASSERT_EQ(counts[r], want.finite);
      std::vector<std::pair<int32_t, uint32_t>> a, b;
      for (int i = 0; i < std::min<int>(kK, int(want.finite)); ++i) {
        const TopPair& p = got[r * kK + size_t(i)];
        a.push_back({p.id, std::bit_cast<uint32_t>(p.logit)});
      }
      for (const lode::sample::Scored& c : want.best) b.push_back({c.id, std::bit_cast<uint32_t>(c.logit)});
      std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
      EXPECT_EQ(a, b);
    }
    const std::vector<unsigned> left = dev.download(arrivals, rows.size());
    EXPECT_EQ(std::count(left.begin(), left.end(), 0u), std::ptrdiff_t(rows.size()));
  }
}

// A window of rows in one launch (their x rows in_stride apart, logits out_stride apart, choices as
// moe_route_window lays them out): each row's logits, choices and weights the bits of a launch of
// that row alone, every choice counted once; windows of 11 rows (blocks of 2, the last ragged) and
// 61 (blocks of 8, the last ragged), rows of 2048 and 2560 values (the weights held across rows,
// and loaded again per row).
TEST(CudaKernels, RouterWindowRowsGetTheBitsOfSingleRows) {
  LODE_REQUIRE_GPU();
  std::mt19937 rng(3);
  constexpr int kRows = kExperts + 1;
  for (const int window_rows : {11, 61})
  for (const int cols : {kHidden, 2560}) {
    SCOPED_TRACE(testing::Message() << window_rows << " rows of " << cols);
    const int64_t in_stride = cols + 4, out_stride = kRows + 3;
    const auto w = normal_floats(size_t(kRows) * cols, rng, 0.05f), x = normal_floats(size_t(window_rows * in_stride), rng);
    const std::vector<uint8_t> resident(kExperts, 1);
    Device dev;
    const float* dw = dev.upload(w);
    float* logits = dev.zeros<float>(size_t(window_rows * out_stride));
    float* weights = dev.zeros<float>(window_rows * kUsed);
    int32_t* ids = dev.zeros<int32_t>(2 * window_rows * kUsed);
    unsigned *counts = dev.zeros<unsigned>(kExperts), *misses = dev.zeros<unsigned>(1);
    unsigned* arrivals = dev.zeros<unsigned>(window_rows);
    const lode::cuda::RouteTally tally{counts, dev.upload(resident), misses};
    lode::cuda::kernels::TokenRows rows{window_rows, in_stride, out_stride};
    ASSERT_EQ(lode::cuda::kernels::router_topk(dw, kRows, cols, dev.upload(x), logits, kExperts, kUsed, ids, weights,
                                               tally, arrivals, nullptr, rows),
              nullptr);
    const auto got_logits = dev.download(logits, size_t(window_rows * out_stride));
    const auto got_ids = dev.download(ids, 2 * window_rows * kUsed);
    const auto got_weights = dev.download(weights, window_rows * kUsed);
    const auto got_counts = dev.download(counts, kExperts);
    EXPECT_EQ(dev.download(arrivals, window_rows), std::vector<unsigned>(window_rows, 0u));
    std::vector<unsigned> want_counts(kExperts, 0);
    for (int t = 0; t < window_rows; ++t) {
      SCOPED_TRACE(t);
      float* one_logits = dev.zeros<float>(kRows);
      float* one_weights = dev.zeros<float>(kUsed);
      int32_t* one_ids = dev.zeros<int32_t>(2 * kUsed);
      const std::vector<float> xt(x.begin() + t * in_stride, x.begin() + t * in_stride + cols);
      ASSERT_EQ(lode::cuda::kernels::router_topk(dw, kRows, cols, dev.upload(xt), one_logits, kExperts, kUsed, one_ids,
                                                 one_weights, {}, dev.zeros<unsigned>(1), nullptr),
                nullptr);
      const auto want_logits = dev.download(one_logits, kRows);
      EXPECT_EQ(std::vector<float>(got_logits.begin() + t * out_stride, got_logits.begin() + t * out_stride + kRows),
                want_logits);
      const auto want_ids = dev.download(one_ids, kUsed);
      const auto want_weights = dev.download(one_weights, kUsed);
      for (int j = 0; j < kUsed; ++j) {
        EXPECT_EQ(got_ids[size_t(t * kUsed + j)], want_ids[size_t(j)]) << "slot " << j;
        EXPECT_EQ(got_ids[size_t(window_rows * kUsed + t * kUsed + j)], want_ids[size_t(j)] + kExperts) << "slot " << j;
        EXPECT_EQ(got_weights[size_t(t * kUsed + j)], want_weights[size_t(j)]) << "slot " << j;
        ++want_counts[size_t(want_ids[size_t(j)])];
      }
    }
    EXPECT_EQ(got_counts, want_counts);
  }
}

// A step's (row, slot) pairs grouped by expert: experts ascending, each expert's pairs in order, at
// most `most` a group (8: an expert of 19 pairs makes groups of 8, 8 and 3), every pair once, and
// the groups after the last empty; against a host grouping of random routes of up to 64 rows. With
// residency flags, the groups of absent experts are counted (added to the counter: a layer's
// steps add up).
TEST(CudaKernels, ExpertGroupsHoldEveryPairOnceByExpert) {
  LODE_REQUIRE_GPU();
  std::mt19937 rng(7);
  for (const int most : {1, 2, 3, 8})
  for (const int rows : {1, 2, 5, 64}) {
    SCOPED_TRACE(testing::Message() << rows << " rows, groups of at most " << most);
    const int pairs = rows * kUsed;
    std::vector<int32_t> ids(static_cast<size_t>(pairs));
    for (int32_t& id : ids) id = int32_t(rng() % 40);  // few experts: long groups
    if (rows == 64) std::fill(ids.begin(), ids.begin() + 19, 3);
    std::vector<lode::cuda::ExpertGroup> want;
    for (int e = 0; e < kExperts; ++e)
      for (int p = 0; p < pairs; ++p) {
        if (ids[size_t(p)] != e) continue;
        if (want.empty() || want.back().id != e || want.back().count == most)
          want.push_back({e, 0, {}});
        want.back().pairs[want.back().count++] = p;
      }
    std::vector<uint8_t> resident(static_cast<size_t>(kExperts));
    for (uint8_t& r : resident) r = uint8_t(rng() % 3 == 0);
    unsigned want_absent = 7;  // (what the counter held before)
    for (const lode::cuda::ExpertGroup& g : want) want_absent += resident[size_t(g.id)] ? 0u : 1u;
    Device dev;
    auto* groups = dev.zeros<lode::cuda::ExpertGroup>(size_t(pairs));
    auto* absent = dev.upload(std::vector<unsigned>{7u});
    ASSERT_EQ(lode::cuda::kernels::expert_groups(dev.upload(ids), pairs, kExperts, most, groups, nullptr,
                                                 dev.upload(resident), absent),
              nullptr);
    EXPECT_EQ(dev.download(absent, 1)[0], want_absent);
    const auto got = dev.download(groups, size_t(pairs));
    for (size_t g = 0; g < got.size(); ++g) {
      SCOPED_TRACE(g);
      if (g >= want.size()) {
        EXPECT_EQ(got[g].count, 0);
        continue;
      }
      ASSERT_EQ(got[g].id, want[g].id);
      ASSERT_EQ(got[g].count, want[g].count);
      for (int i = 0; i < got[g].count; ++i) EXPECT_EQ(got[g].pairs[i], want[g].pairs[i]);
    }
  }
}

// The prompt pass's DeltaNet scan (cuda/prompt_kernels.h), the 35B-A3B's heads: against the CPU's
// delta rule token by token (cpu::deltanet_head_step; q and k L2-normed as deltanet_prepare leaves
// them), and 17 sequences of 1 to 38 tokens in one call (two launches: 16 sequences, then 1) each
// with the bits of a call of its own.
TEST(CudaKernels, DeltaNetScanMatchesTheCpuAndSequencesGoTogether) {
  LODE_REQUIRE_GPU();
  std::mt19937 rng(11);
  constexpr int kSequences = 17;
  constexpr size_t kStateFloats = size_t(kValueHeads) * kDk * kDv;
  const auto a = normal_floats(kValueHeads, rng, 0.5f, -1.0f), dt_bias = normal_floats(kValueHeads, rng, 0.5f);
  struct Sequence {
    int tokens;
    std::vector<float> state, qkv, b, alpha;
  };
  std::vector<Sequence> sequences;
  for (int i = 0; i < kSequences; ++i) {
    Sequence q{1 + (7 * i) % 40, normal_floats(kStateFloats, rng, 0.1f), {}, {}, {}};
    q.qkv = normal_floats(size_t(q.tokens) * kChannels, rng);
    for (int t = 0; t < q.tokens; ++t)
      for (int head = 0; head < 2 * kKeyHeads; ++head)
        lode::cpu::l2_norm(&q.qkv[size_t(t) * kChannels + size_t(head) * kDk], kDk, 1e-6f);
    q.b = normal_floats(size_t(q.tokens) * kValueHeads, rng), q.alpha = normal_floats(size_t(q.tokens) * kValueHeads, rng);
    sequences.push_back(std::move(q));
  }
  Device dev;
  const float *da = dev.upload(a), *ddt_bias = dev.upload(dt_bias);
  // Each sequence's rows on the device, from its starting state: out o [tokens][hv dv].
  const auto rows_of = [&](const Sequence& q) {
    return lode::cuda::kernels::ScanRows{dev.upload(q.state), dev.upload(q.qkv), dev.upload(q.b), dev.upload(q.alpha),
                                         dev.zeros<float>(size_t(q.tokens) * kValueHeads * kDv), q.tokens};
  };
  std::vector<lode::cuda::kernels::ScanRows> together;
  for (const Sequence& q : sequences) together.push_back(rows_of(q));
  ASSERT_EQ(lode::cuda::kernels::deltanet_scan(together.data(), kSequences, kChannels, da, ddt_bias, kKeyHeads,
                                               kValueHeads, kDk, kDv, nullptr),
            nullptr);
  for (int i = 0; i < kSequences; ++i) {
    const Sequence& q = sequences[size_t(i)];
    SCOPED_TRACE("sequence " + std::to_string(i) + " of " + std::to_string(q.tokens) + " tokens");
    const lode::cuda::kernels::ScanRows alone = rows_of(q);
    ASSERT_EQ(lode::cuda::kernels::deltanet_scan(&alone, 1, kChannels, da, ddt_bias, kKeyHeads, kValueHeads, kDk, kDv,
                                                 nullptr),
              nullptr);
    const size_t outputs = size_t(q.tokens) * kValueHeads * kDv;
    const auto got_o = dev.download(together[size_t(i)].o, outputs);
    const auto got_state = dev.download(together[size_t(i)].state, kStateFloats);
    EXPECT_EQ(got_o, dev.download(alone.o, outputs));
    EXPECT_EQ(got_state, dev.download(alone.state, kStateFloats));
    std::vector<float> state = q.state, want(outputs);
    for (int t = 0; t < q.tokens; ++t) {
      const size_t head_rows = size_t(t) * kValueHeads;
      cpu_delta_rule(state, &q.qkv[size_t(t) * kChannels], &q.b[head_rows], &q.alpha[head_rows], a, dt_bias,
                     &want[head_rows * kDv]);
    }
    EXPECT_LT(lode::test::relative_error(got_state, state), 1e-4);
    EXPECT_LT(lode::test::relative_error(got_o, want), 1e-4);
  }
}

// The scan's layouts (cuda/prompt_kernels.cu: a state column on 8 lanes up to 64 key rows, on 16 up
// to 128, two columns a lane there for a launch of several sequences, on 32 up to 256) at other head
// sizes: key rows that leave a lane's last four empty (36, 100), fewer than 128 on 16 lanes (96), a
// last block of columns part empty (dv not a multiple of a block's columns; odd, 21: a lane's second
// column past it), 70 tokens (more than a tile of 64), against the CPU's delta rule, one sequence
// alone and two in a launch each with the bits of the one alone.
TEST(CudaKernels, DeltaNetScansOfOtherHeadSizesMatchTheCpu) {
  LODE_REQUIRE_GPU();
  std::mt19937 rng(12);
  struct Heads {
    int hk, hv, dk, dv;
  };
  for (const Heads g : {Heads{2, 4, 36, 48}, Heads{2, 4, 64, 40}, Heads{2, 4, 96, 20}, Heads{1, 2, 100, 24},
                        Heads{2, 4, 128, 21}, Heads{1, 2, 256, 20}}) {
    SCOPED_TRACE(fmt::format("dk {}, dv {}", g.dk, g.dv));
    const int channels = 2 * g.hk * g.dk + g.hv * g.dv, tokens = 70;
    const size_t state_floats = size_t(g.hv) * g.dk * g.dv;
    const auto a = normal_floats(size_t(g.hv), rng, 0.5f, -1.0f), dt_bias = normal_floats(size_t(g.hv), rng, 0.5f);
    auto qkv = normal_floats(size_t(tokens) * channels, rng);
    for (int t = 0; t < tokens; ++t)
      for (int head = 0; head < 2 * g.hk; ++head)
        lode::cpu::l2_norm(&qkv[size_t(t) * channels + size_t(head) * g.dk], g.dk, 1e-6f);
    const auto b = normal_floats(size_t(tokens) * g.hv, rng), alpha = normal_floats(size_t(tokens) * g.hv, rng);
    const auto state0 = normal_floats(state_floats, rng, 0.1f);
    std::vector<float> state = state0, want(size_t(tokens) * g.hv * g.dv);
    for (int t = 0; t < tokens; ++t)
      for (int s = 0; s < g.hv; ++s) {
        const float* row = &qkv[size_t(t) * channels];
        const size_t key = size_t(s % g.hk) * g.dk, at = size_t(t) * g.hv + size_t(s);
        lode::cpu::deltanet_head_step(&state[size_t(s) * g.dk * g.dv], row + key, row + size_t(g.hk) * g.dk + key,
                                      row + 2 * size_t(g.hk) * g.dk + size_t(s) * g.dv,
                                      a[size_t(s)] * lode::cpu::softplus(alpha[at] + dt_bias[size_t(s)]),
                                      lode::cpu::sigmoid(b[at]), g.dk, g.dv, &want[at * g.dv]);
      }
    Device dev;
    const float *da = dev.upload(a), *ddt_bias = dev.upload(dt_bias);
    std::vector<float> alone_state, alone_o;
    for (const int count : {1, 2}) {
      SCOPED_TRACE(fmt::format("{} sequences a launch", count));
      std::vector<lode::cuda::kernels::ScanRows> rows;
      for (int i = 0; i < count; ++i)
        rows.push_back({dev.upload(state0), dev.upload(qkv), dev.upload(b), dev.upload(alpha),
                        dev.zeros<float>(want.size()), tokens});
      ASSERT_EQ(lode::cuda::kernels::deltanet_scan(rows.data(), count, channels, da, ddt_bias, g.hk, g.hv, g.dk, g.dv,
                                                   nullptr),
                nullptr);
      for (const lode::cuda::kernels::ScanRows& r : rows) {
        const std::vector<float> got_state = dev.download(r.state, state_floats);
        const std::vector<float> got_o = dev.download(r.o, want.size());
        EXPECT_LT(lode::test::relative_error(got_state, state), 1e-4);
        EXPECT_LT(lode::test::relative_error(got_o, want), 1e-4);
        if (count == 1) alone_state = got_state, alone_o = got_o;
        EXPECT_EQ(got_state, alone_state);
        EXPECT_EQ(got_o, alone_o);
      }
    }
  }
}

}  // namespace

#else

TEST(CudaKernels, NeedsACudaBuild) { LODE_REQUIRE_GPU(); }

#endif
