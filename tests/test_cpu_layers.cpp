// Each mixer of the CPU forward pass against a naive, independent reimplementation written here
// from the spec (double precision, whole history recomputed per token, HF head order for DeltaNet):
// Gated DeltaNet (conv, gates, delta rule, gated norm, GGUF's tiled value-head order), MoE routing;
// and matmul on quantized rows. Gated attention is checked in test_kv_formats.cpp, in every K/V
// cache format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/attention.h"
#include "cpu/deltanet.h"
#include "cpu/fast_rows.h"
#include "cpu/matmul.h"
#include "cpu/moe.h"
#include "cpu/state.h"
#include "support/naive_math.h"
#include "support/random.h"

namespace {

using lode::model::MatrixView;
using lode::model::Qwen35MoeConfig;
using lode::test::Vec;

using lode::test::f32_view;
using lode::test::mat_vec;
using lode::test::normal_floats;
using lode::test::relative_error;
using lode::test::rms_norm;
using lode::test::sigmoid;
using lode::test::silu;

Qwen35MoeConfig small_config() {
  Qwen35MoeConfig c;
  c.hidden = 48;
  c.n_layers = 1;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.rope_dims = 8;
  c.rope_theta = 10000.0;
  c.rms_eps = 1e-6;
  c.n_experts = 6;
  c.n_experts_used = 2;
  c.expert_ff = 8;
  c.shared_ff = 12;
  c.ssm_conv_kernel = 4;
  c.ssm_state = 8;
  c.ssm_groups = 2;
  c.ssm_dt_rank = 6;  // 3 value heads per key head
  c.ssm_inner = 6 * 8;
  c.vocab = 10;
  c.context_length = 64;
  return c;
}

// --- Gated DeltaNet ------------------------------------------------------------------------------

// The HF weights of one DeltaNet layer: value heads grouped (head j uses key head j / (Hv/Hk)).
struct HfDeltaNet {
  std::vector<float> qkv, z, b, a, out, conv, dt_bias, ssm_a, norm;
};

// GGUF slot s = r * Hk + k holds HF value head j = k * (Hv/Hk) + r.
int64_t hf_head_of_slot(int64_t s, int64_t hk, int64_t hv) {
  return (s % hk) * (hv / hk) + s / hk;
}

// Moves blocks of `block` consecutive rows (or values) of the value part from HF to GGUF order.
std::vector<float> reorder_rows(const std::vector<float>& m, int64_t offset_rows, int64_t block,
                                int64_t cols, int64_t hk, int64_t hv) {
  std::vector<float> out = m;
  for (int64_t s = 0; s < hv; ++s) {
    const int64_t j = hf_head_of_slot(s, hk, hv);
    std::copy_n(m.begin() + (offset_rows + j * block) * cols, block * cols,
                out.begin() + (offset_rows + s * block) * cols);
  }
  return out;
}

TEST(CpuLayers, DeltaNetMatchesNaiveReferenceInHfHeadOrder) {
  const Qwen35MoeConfig c = small_config();
  const int64_t H = c.hidden, hk = c.ssm_groups, hv = c.ssm_dt_rank, d = c.ssm_state;
  const int64_t C = c.conv_channels(), K = c.ssm_conv_kernel, key_dim = hk * d;
  std::mt19937 rng(2);
  HfDeltaNet hf;
  hf.qkv = normal_floats(size_t(C * H), rng, 0.3f);
  hf.z = normal_floats(size_t(hv * d * H), rng, 0.3f);
  hf.b = normal_floats(size_t(hv * H), rng, 0.3f);
  hf.a = normal_floats(size_t(hv * H), rng, 0.3f);
  hf.out = normal_floats(size_t(H * hv * d), rng, 0.3f);
  hf.conv = normal_floats(size_t(C * K), rng, 0.5f);
  hf.dt_bias = normal_floats(size_t(hv), rng, 0.5f);
  hf.ssm_a = normal_floats(size_t(hv), rng, 0.5f);
  for (float& x : hf.ssm_a) x = -std::exp(x);
  hf.norm = normal_floats(size_t(d), rng, 0.2f, 1.0f);

  // The GGUF layout lode reads.
  lode::model::DeltaNetWeights w;
  const auto qkv = reorder_rows(hf.qkv, 2 * key_dim, d, H, hk, hv);
  const auto z = reorder_rows(hf.z, 0, d, H, hk, hv);
  const auto b = reorder_rows(hf.b, 0, 1, H, hk, hv);
  const auto a = reorder_rows(hf.a, 0, 1, H, hk, hv);
  w.conv = reorder_rows(hf.conv, 2 * key_dim, d, K, hk, hv);
  w.dt_bias = reorder_rows(hf.dt_bias, 0, 1, 1, hk, hv);
  w.a = reorder_rows(hf.ssm_a, 0, 1, 1, hk, hv);
  w.norm = hf.norm;
  std::vector<float> out(hf.out.size());  // columns reordered: per output row, blocks of d
  for (int64_t r = 0; r < H; ++r)
    for (int64_t s = 0; s < hv; ++s)
      std::copy_n(hf.out.begin() + r * hv * d + hf_head_of_slot(s, hk, hv) * d, d,
                  out.begin() + r * hv * d + s * d);
  w.qkv = f32_view(qkv, C, H);
  w.gate = f32_view(z, hv * d, H);
  w.beta = f32_view(b, hv, H);
  w.alpha = f32_view(a, hv, H);
  w.out = f32_view(out, H, hv * d);

  const int64_t T = 23;
  const auto x = normal_floats(size_t(T * H), rng, 1.0f);
  Qwen35MoeConfig one = c;
  one.is_recurrent = {true};
  // Recurrent form: chunks of 3, 4 and 16 tokens.
  lode::cpu::SequenceState state(one, lode::kv::Format::f32);
  std::vector<float> got(size_t(T * H));
  lode::cpu::deltanet_forward(w, c, state.deltanet[0], x.data(), got.data(), 3, {.threads = 2});
  lode::cpu::deltanet_forward(w, c, state.deltanet[0], x.data() + 3 * H, got.data() + 3 * H, 4, {.threads = 1});
  lode::cpu::deltanet_forward(w, c, state.deltanet[0], x.data() + 7 * H, got.data() + 7 * H, 16, {.threads = 2});
  // Chunked (WY) form: a 16-token chunk in WY chunks of 5, then 7 tokens in one WY chunk.
  lode::cpu::SequenceState wy_state(one, lode::kv::Format::f32);
  std::vector<float> wy(size_t(T * H));
  lode::cpu::deltanet_forward(w, c, wy_state.deltanet[0], x.data(), wy.data(), 16, {.threads = 2}, 5);
  lode::cpu::deltanet_forward(w, c, wy_state.deltanet[0], x.data() + 16 * H, wy.data() + 16 * H,
                              7, {.threads = 1}, 64);

  // Naive, HF order: conv over the whole history with zero padding, recurrence in double.
  std::vector<Vec> mixed(T);
  for (int64_t t = 0; t < T; ++t) mixed[t] = mat_vec(hf.qkv, C, H, x.data() + t * H);
  std::vector<Vec> S(size_t(hv), Vec(size_t(d * d), 0.0));
  Vec want(size_t(T * H));
  for (int64_t t = 0; t < T; ++t) {
    Vec conv(static_cast<size_t>(C));
    for (int64_t ch = 0; ch < C; ++ch) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t src = t - (K - 1) + k;
        if (src >= 0) acc += hf.conv[ch * K + k] * mixed[src][ch];
      }
      conv[ch] = silu(acc);
    }
    for (int64_t h = 0; h < 2 * hk; ++h) {  // q heads then k heads: L2 norm
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += conv[h * d + i] * conv[h * d + i];
      for (int64_t i = 0; i < d; ++i) conv[h * d + i] /= std::sqrt(ss + 1e-6);
    }
    const Vec zt = mat_vec(hf.z, hv * d, H, x.data() + t * H);
    const Vec bt = mat_vec(hf.b, hv, H, x.data() + t * H);
    const Vec at = mat_vec(hf.a, hv, H, x.data() + t * H);
    Vec o(size_t(hv * d));
    for (int64_t j = 0; j < hv; ++j) {
      const int64_t kh = j / (hv / hk);
      const double* q = &conv[kh * d];
      const double* k = &conv[key_dim + kh * d];
      const double* v = &conv[2 * key_dim + j * d];
      const double beta = sigmoid(bt[j]);
      const double sp = std::log1p(std::exp(at[j] + hf.dt_bias[j]));
      const double g = hf.ssm_a[j] * sp;
      Vec& s = S[j];
      for (double& e : s) e *= std::exp(g);
      for (int64_t col = 0; col < d; ++col) {
        double kv = 0;
        for (int64_t i = 0; i < d; ++i) kv += s[i * d + col] * k[i];
        const double delta = beta * (v[col] - kv);
        for (int64_t i = 0; i < d; ++i) s[i * d + col] += k[i] * delta;
      }
      for (int64_t col = 0; col < d; ++col) {
        double acc = 0;
        for (int64_t i = 0; i < d; ++i) acc += s[i * d + col] * q[i] / std::sqrt(double(d));
        o[j * d + col] = acc;
      }
      rms_norm(&o[j * d], d, hf.norm.data(), c.rms_eps);
      for (int64_t col = 0; col < d; ++col) o[j * d + col] *= silu(zt[j * d + col]);
    }
    const Vec y = mat_vec(hf.out, H, hv * d, o);
    std::copy(y.begin(), y.end(), want.begin() + t * H);
  }
  EXPECT_LE(relative_error(got, want), 1e-4);
  EXPECT_LE(relative_error(wy, want), 1e-4);
  // Both forms leave the same state behind.
  std::vector<float> s_wy = wy_state.deltanet[0].s;
  Vec s_rec(state.deltanet[0].s.begin(), state.deltanet[0].s.end());
  EXPECT_LE(relative_error(s_wy, s_rec), 1e-5);
}

// The chunked form equals the recurrent one for one head, decays from none to total included
// (e^-60 underflows the chunk's cumulative decay: nothing may overflow or turn into NaN).
TEST(CpuLayers, ChunkedDeltaRuleEqualsRecurrentOneForAnyDecay) {
  const int64_t dk = 16, dv = 8, L = 64;
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  auto q = normal_floats(size_t(L * dk), rng, 0.25f);
  auto k = normal_floats(size_t(L * dk), rng, 0.25f);
  const auto v = normal_floats(size_t(L * dv), rng, 1.0f);
  std::vector<float> g(static_cast<size_t>(L)), beta(static_cast<size_t>(L));
  for (int64_t t = 0; t < L; ++t) {
    g[t] = t % 16 == 5 ? -60.0f : -2.0f * unit(rng) * unit(rng);
    beta[t] = unit(rng);
  }
  const auto s0 = normal_floats(size_t(dk * dv), rng, 0.5f);
  std::vector<float> s_step = s0, s_chunk = s0;
  std::vector<float> o_step(size_t(L * dv)), o_chunk(size_t(L * dv));
  for (int64_t t = 0; t < L; ++t) {
    lode::cpu::deltanet_head_step(s_step.data(), &q[t * dk], &k[t * dk], &v[t * dv], g[t], beta[t],
                                  dk, dv, &o_step[t * dv]);
  }
  lode::cpu::deltanet_head_chunk(s_chunk.data(), q.data(), k.data(), dk, v.data(), dv, g.data(),
                                 beta.data(), L, dk, dv, o_chunk.data(), dv);
  for (float x : o_chunk) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LE(relative_error(o_chunk, Vec(o_step.begin(), o_step.end())), 1e-5);
  EXPECT_LE(relative_error(s_chunk, Vec(s_step.begin(), s_step.end())), 1e-5);
}

// --- MoE -----------------------------------------------------------------------------------------

TEST(CpuLayers, MoeMatchesNaiveReference) {
  const Qwen35MoeConfig c = small_config();
  const int64_t H = c.hidden, E = c.n_experts, ff = c.expert_ff, sff = c.shared_ff;
  std::mt19937 rng(3);
  const auto router = normal_floats(size_t(E * H), rng, 0.5f);
  const auto gate = normal_floats(size_t(E * ff * H), rng, 0.3f);
  const auto up = normal_floats(size_t(E * ff * H), rng, 0.3f);
  const auto down = normal_floats(size_t(E * H * ff), rng, 0.3f);
  const auto sgate = normal_floats(size_t(sff * H), rng, 0.3f);
  const auto sup = normal_floats(size_t(sff * H), rng, 0.3f);
  const auto sdown = normal_floats(size_t(H * sff), rng, 0.3f);
  lode::model::MoeWeights w;
  w.router = f32_view(router, E, H);
  w.gate = {MatrixView{&lode::traits(lode::GgmlType::F32),
                       reinterpret_cast<const uint8_t*>(gate.data()), H, ff, size_t(H) * 4},
            size_t(ff * H) * 4, E};
  w.up = {MatrixView{&lode::traits(lode::GgmlType::F32),
                     reinterpret_cast<const uint8_t*>(up.data()), H, ff, size_t(H) * 4},
          size_t(ff * H) * 4, E};
  w.down = {MatrixView{&lode::traits(lode::GgmlType::F32),
                       reinterpret_cast<const uint8_t*>(down.data()), ff, H, size_t(ff) * 4},
            size_t(H * ff) * 4, E};
  w.shared_gate_inp = normal_floats(size_t(H), rng, 0.3f);
  w.shared_gate = f32_view(sgate, sff, H);
  w.shared_up = f32_view(sup, sff, H);
  w.shared_down = f32_view(sdown, H, sff);

  const int64_t T = 5;
  const auto x = normal_floats(size_t(T * H), rng, 1.0f);
  std::vector<float> got(size_t(T * H));
  lode::cpu::moe_forward(w, c, x.data(), got.data(), T, {.threads = 2});

  Vec want(size_t(T * H), 0.0);
  auto expert = [&](const float* g, const float* u, const float* dn, int64_t width,
                    const float* xt) {
    Vec h(static_cast<size_t>(width));
    for (int64_t i = 0; i < width; ++i) {
      double gs = 0, us = 0;
      for (int64_t j = 0; j < H; ++j) gs += double(g[i * H + j]) * xt[j], us += double(u[i * H + j]) * xt[j];
      h[i] = silu(gs) * us;
    }
    Vec y(size_t(H), 0.0);
    for (int64_t r = 0; r < H; ++r)
      for (int64_t i = 0; i < width; ++i) y[r] += double(dn[r * width + i]) * h[i];
    return y;
  };
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x.data() + t * H;
    Vec p = mat_vec(router, E, H, xt);
    const double m = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& e : p) sum += (e = std::exp(e - m));
    for (double& e : p) e /= sum;
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double top = 0;
    for (int64_t j = 0; j < c.n_experts_used; ++j) top += p[order[j]];
    for (int64_t j = 0; j < c.n_experts_used; ++j) {
      const int e = order[j];
      const Vec y = expert(gate.data() + e * ff * H, up.data() + e * ff * H,
                           down.data() + e * H * ff, ff, xt);
      for (int64_t r = 0; r < H; ++r) want[t * H + r] += p[e] / top * y[r];
    }
    double s = 0;
    for (int64_t j = 0; j < H; ++j) s += double(w.shared_gate_inp[j]) * xt[j];
    const Vec y = expert(sgate.data(), sup.data(), sdown.data(), sff, xt);
    for (int64_t r = 0; r < H; ++r) want[t * H + r] += sigmoid(s) * y[r];
  }
  EXPECT_LE(relative_error(got, want), 1e-4);
}

// --- matmul on quantized rows ------------------------------------------------------------------

// dot4 gives each row dot()'s bits (matmul's results must not depend on how rows are grouped):
// lengths with and without a tail, values of mixed magnitudes so a different order would round
// differently.
TEST(CpuLayers, Dot4GivesEachRowTheBitsOfDot) {
  std::mt19937 rng(6);
  for (int64_t n : {1, 7, 8, 9, 64, 255, 2048, 2051}) {
    std::vector<std::vector<float>> rows;
    for (int r = 0; r < 4; ++r) {
      rows.push_back(normal_floats(size_t(n), rng, 1.0f));
      for (int64_t i = 0; i < n; i += 5) rows.back()[size_t(i)] *= 1e4f;
    }
    const auto x = normal_floats(size_t(n), rng, 1.0f);
    const float* a[4] = {rows[0].data(), rows[1].data(), rows[2].data(), rows[3].data()};
    float got[4];
    lode::cpu::dot4(a, x.data(), n, got);
    for (int r = 0; r < 4; ++r) {
      const float want = lode::cpu::dot(a[r], x.data(), n);
      EXPECT_EQ(0, std::memcmp(&want, &got[r], sizeof want)) << "n " << n << " row " << r << ": " << got[r] << " vs " << want;
    }
  }
}

// 43 rows: ten groups of four and a group of three (matmul dots rows four at a time); each output
// is also the plain dot() of its row.
TEST(CpuLayers, MatmulOnQuantizedRowsEqualsMatmulOnTheirValues) {
  std::mt19937 rng(4);
  const int64_t rows = 43, cols = 256, T = 3;
  const auto values = normal_floats(size_t(rows * cols), rng, 1.0f);
  const auto x = normal_floats(size_t(T * cols), rng, 1.0f);
  for (lode::GgmlType type : {lode::GgmlType::Q8_0, lode::GgmlType::Q4_K, lode::GgmlType::Q6_K,
                              lode::GgmlType::F16, lode::GgmlType::BF16}) {
    const auto& traits = lode::traits(type);
    const size_t rb = lode::row_bytes(type, cols);
    std::vector<uint8_t> q(rb * size_t(rows));
    std::vector<float> dq(values.size());
    for (int64_t r = 0; r < rows; ++r) {
      traits.quantize(values.data() + r * cols, q.data() + r * rb, cols);
      traits.dequantize(q.data() + r * rb, dq.data() + r * cols, cols);
    }
    const MatrixView view{&traits, q.data(), cols, rows, rb};
    for (const int64_t inputs : {T, int64_t(1)}) {  // (one input: q8_0 rows are dotted as they are decoded)
      std::vector<float> got(size_t(inputs * rows)), want(size_t(inputs * rows));
      lode::cpu::matmul(view, x.data(), got.data(), inputs, {.threads = 2});
      lode::cpu::matmul(f32_view(dq, rows, cols), x.data(), want.data(), inputs, {.threads = 1});
      EXPECT_EQ(got, want) << traits.name;
      for (int64_t t = 0; t < inputs; ++t)
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_EQ(got[size_t(t * rows + r)], lode::cpu::dot(dq.data() + r * cols, x.data() + t * cols, cols))
              << traits.name << " row " << r << " input " << t << " of " << inputs;
    }
  }
}

// The fast decoders give the reference converters' floats bit for bit, on random bytes (any
// scale, NaN and infinity included, every code pattern) and on quantized data: the host's (AVX2
// ones where it has AVX2) and the portable ones (for q5_0 the reference converter itself).
TEST(CpuLayers, FastRowDecodersAreBitExact) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 255);
  using lode::cpu::Decoders;
  for (const Decoders decoders : {Decoders::host, Decoders::portable}) {
    for (lode::GgmlType type : {lode::GgmlType::Q8_0, lode::GgmlType::Q4_K, lode::GgmlType::Q5_K,
                                lode::GgmlType::Q6_K, lode::GgmlType::Q5_0}) {
      const auto& traits = lode::traits(type);
      const int64_t n = 256 * 8;
      std::vector<uint8_t> bytes(lode::row_bytes(type, n));
      for (int round = 0; round < 50; ++round) {
        if (round % 2 == 0) {
          for (uint8_t& b : bytes) b = uint8_t(byte(rng));
        } else {
          const auto values = normal_floats(size_t(n), rng, 3.0f);
          traits.quantize(values.data(), bytes.data(), n);
        }
        std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
        traits.dequantize(bytes.data(), want.data(), n);
        lode::cpu::row_decoder(type, decoders)(bytes.data(), got.data(), n);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << traits.name << " round " << round << (decoders == Decoders::host ? " (host's)" : " (portable)");
      }
    }
  }
}

}  // namespace
