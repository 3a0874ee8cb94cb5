#include "cpu/deltanet.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "cpu/matmul.h"
#include "cpu/ops.h"

namespace lode::cpu {

void deltanet_head_step(float* s, const float* q, const float* k, const float* v, float g,
                        float beta, int64_t dk, int64_t dv, float* o) {
  const float decay = std::exp(g);
  for (int64_t i = 0; i < dk * dv; ++i) s[i] *= decay;
  // d = beta * (v - S^T k): what the state should have returned for k, minus what it returns.
  std::vector<float> d(size_t(dv), 0.0f);
  for (int64_t i = 0; i < dk; ++i) {
    const float ki = k[i];
    const float* row = s + i * dv;
    for (int64_t j = 0; j < dv; ++j) d[j] += row[j] * ki;
  }
  for (int64_t j = 0; j < dv; ++j) d[j] = beta * (v[j] - d[j]);
  for (int64_t j = 0; j < dv; ++j) o[j] = 0.0f;
  for (int64_t i = 0; i < dk; ++i) {
    const float ki = k[i], qi = q[i];
    float* row = s + i * dv;
    for (int64_t j = 0; j < dv; ++j) {
      row[j] += ki * d[j];
      o[j] += row[j] * qi;
    }
  }
}

void deltanet_conv_step(const float* w, float* state, float* x, int64_t channels, int64_t kernel) {
  const int64_t keep = kernel - 1;
  for (int64_t c = 0; c < channels; ++c) {
    const float* wc = w + c * kernel;
    float* sc = state + c * keep;
    float acc = 0.0f;
    for (int64_t k = 0; k < keep; ++k) acc += wc[k] * sc[k];
    acc += wc[keep] * x[c];
    for (int64_t k = 0; k + 1 < keep; ++k) sc[k] = sc[k + 1];
    if (keep > 0) sc[keep - 1] = x[c];
    x[c] = silu(acc);
  }
}

namespace {

// The chunk's projections: [Q | K | V] channels, z, and per value head the raw b and a.
struct Projections {
  std::vector<float> qkv, z, beta, g;
};

// Conv, SiLU, L2 norms (q also scaled by 1/sqrt(dk)), beta = sigmoid(b) and the log-decay
// g = ssm_a * softplus(a + dt_bias) of every token, in place. The conv is the only sequential part.
void prepare_tokens(const model::DeltaNetWeights& w, const model::Qwen35MoeConfig& c,
                    DeltaNetState& state, Projections& p, int64_t n_tokens, std::span<DeltaNetState> before_each) {
  const int64_t channels = c.conv_channels(), hk = c.ssm_groups, hv = c.ssm_dt_rank;
  const int64_t dk = c.ssm_state, key_dim = c.ssm_key_dim();
  const float q_scale = 1.0f / std::sqrt(float(dk));
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (!before_each.empty() && t > 0) before_each[size_t(t - 1)].conv.assign(state.conv.begin(), state.conv.end());
    float* xt = p.qkv.data() + t * channels;
    deltanet_conv_step(w.conv.data(), state.conv.data(), xt, channels, c.ssm_conv_kernel);
    for (int64_t h = 0; h < hk; ++h) {
      float* q = xt + h * dk;
      l2_norm(q, dk, 1e-6f);
      for (int64_t i = 0; i < dk; ++i) q[i] *= q_scale;
      l2_norm(xt + key_dim + h * dk, dk, 1e-6f);
    }
    for (int64_t s = 0; s < hv; ++s) {
      float& beta = p.beta[t * hv + s];
      float& g = p.g[t * hv + s];
      beta = sigmoid(beta);
      g = w.a[s] * softplus(g + w.dt_bias[s]);
    }
  }
}

// Value head s over the chunk: the recurrence (token by token, or wy_chunk tokens at a time in
// the chunked form), then the gated RMSNorm (plain weight, times silu(z)). Writes its dv columns
// of o [n_tokens, Hv * dv].
void run_head(const model::DeltaNetWeights& w, const model::Qwen35MoeConfig& c, DeltaNetState& state,
              const Projections& p, int64_t s, int64_t n_tokens, int64_t wy_chunk, float* o,
              std::span<DeltaNetState> before_each) {
  const int64_t channels = c.conv_channels(), hk = c.ssm_groups, hv = c.ssm_dt_rank;
  const int64_t dk = c.ssm_state, dv = c.ssm_state, key_dim = c.ssm_key_dim();
  const int64_t value_dim = c.ssm_value_dim(), kh = s % hk;
  const float* q = p.qkv.data() + kh * dk;
  const float* k = p.qkv.data() + key_dim + kh * dk;
  const float* v = p.qkv.data() + 2 * key_dim + s * dv;
  float* os = o + s * dv;
  float* state_s = state.s.data() + s * dk * dv;
  if (wy_chunk > 1) {
    std::vector<float> g(static_cast<size_t>(n_tokens)), beta(static_cast<size_t>(n_tokens));
    for (int64_t t = 0; t < n_tokens; ++t) g[t] = p.g[t * hv + s], beta[t] = p.beta[t * hv + s];
    for (int64_t t0 = 0; t0 < n_tokens; t0 += wy_chunk) {
      const int64_t len = std::min(wy_chunk, n_tokens - t0);
      deltanet_head_chunk(state_s, q + t0 * channels, k + t0 * channels, channels,
                          v + t0 * channels, channels, g.data() + t0, beta.data() + t0, len, dk,
                          dv, os + t0 * value_dim, value_dim);
    }
  } else {
    for (int64_t t = 0; t < n_tokens; ++t) {
      if (!before_each.empty() && t > 0)  // (each head copies its own part: the heads run in parallel)
        std::copy(state_s, state_s + dk * dv, before_each[size_t(t - 1)].s.data() + s * dk * dv);
      deltanet_head_step(state_s, q + t * channels, k + t * channels, v + t * channels,
                         p.g[t * hv + s], p.beta[t * hv + s], dk, dv, os + t * value_dim);
    }
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* ot = os + t * value_dim;
    rms_norm(ot, w.norm.data(), ot, dv, float(c.rms_eps));
    const float* zs = p.z.data() + t * value_dim + s * dv;
    for (int64_t j = 0; j < dv; ++j) ot[j] *= silu(zs[j]);
  }
}

}  // namespace

void deltanet_forward(const model::DeltaNetWeights& w, const model::Qwen35MoeConfig& c,
                      DeltaNetState& state, const float* x, float* out, int64_t n_tokens,
                      const Compute& compute, int64_t wy_chunk, std::span<DeltaNetState> before_each) {
  const int64_t hv = c.ssm_dt_rank, value_dim = c.ssm_value_dim();
  if (!before_each.empty() && (wy_chunk > 1 || int64_t(before_each.size()) != n_tokens - 1))
    fail("cpu deltanet: the states before each token need the recurrent form and one state per token but the first");
  for (DeltaNetState& before : before_each) before.s.resize(state.s.size());
  Projections p;
  p.qkv.resize(size_t(n_tokens * c.conv_channels()));
  p.z.resize(size_t(n_tokens * value_dim));
  p.beta.resize(size_t(n_tokens * hv));
  p.g.resize(size_t(n_tokens * hv));
  matmul(w.qkv, x, p.qkv.data(), n_tokens, compute);
  matmul(w.gate, x, p.z.data(), n_tokens, compute);
  matmul(w.beta, x, p.beta.data(), n_tokens, compute);
  matmul(w.alpha, x, p.g.data(), n_tokens, compute);
  prepare_tokens(w, c, state, p, n_tokens, before_each);

  std::vector<float> o(size_t(n_tokens * value_dim));
  const int n_threads = compute.resolved_threads();
  const bool parallel = hv > 1 && n_tokens * c.ssm_state * c.ssm_state >= 4096;
#pragma omp parallel for num_threads(n_threads) if (parallel)
  for (int64_t s = 0; s < hv; ++s) run_head(w, c, state, p, s, n_tokens, wy_chunk, o.data(), before_each);
  matmul(w.out, o.data(), out, n_tokens, compute);
}

}  // namespace lode::cpu
