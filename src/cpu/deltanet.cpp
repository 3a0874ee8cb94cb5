#include "cpu/deltanet.h"

#include <omp.h>

#include <cmath>
#include <vector>

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

namespace {

// Causal depthwise conv over time for one token: out[c] = sum_k w[c][k] * x[c, t-K+1+k], where
// the first K-1 inputs come from the state (oldest first); then the state shifts by one. SiLU.
void conv_step(const std::vector<float>& w, std::vector<float>& state, float* x, int64_t channels,
               int64_t kernel) {
  const int64_t keep = kernel - 1;
  for (int64_t c = 0; c < channels; ++c) {
    const float* wc = w.data() + c * kernel;
    float* sc = state.data() + c * keep;
    float acc = 0.0f;
    for (int64_t k = 0; k < keep; ++k) acc += wc[k] * sc[k];
    acc += wc[keep] * x[c];
    for (int64_t k = 0; k + 1 < keep; ++k) sc[k] = sc[k + 1];
    if (keep > 0) sc[keep - 1] = x[c];
    x[c] = silu(acc);
  }
}

}  // namespace

void deltanet_forward(const DeltaNetWeights& w, const model::Qwen35MoeConfig& c,
                      DeltaNetState& state, const float* x, float* out, int64_t n_tokens,
                      int threads) {
  const int64_t channels = c.conv_channels(), hk = c.ssm_groups, hv = c.ssm_dt_rank;
  const int64_t dk = c.ssm_state, dv = c.ssm_state, key_dim = c.ssm_key_dim();
  const int64_t value_dim = c.ssm_value_dim();
  std::vector<float> qkv(size_t(n_tokens * channels)), z(size_t(n_tokens * value_dim));
  std::vector<float> b(size_t(n_tokens * hv)), a(size_t(n_tokens * hv));
  matmul(w.qkv, x, qkv.data(), n_tokens, threads);
  matmul(w.gate, x, z.data(), n_tokens, threads);
  matmul(w.beta, x, b.data(), n_tokens, threads);
  matmul(w.alpha, x, a.data(), n_tokens, threads);

  std::vector<float> o(size_t(n_tokens * value_dim));
  const float q_scale = 1.0f / std::sqrt(float(dk));
  const float eps = float(c.rms_eps);
  const int n_threads = threads > 0 ? threads : omp_get_max_threads();
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* xt = qkv.data() + t * channels;
    conv_step(w.conv, state.conv, xt, channels, c.ssm_conv_kernel);
    float* q = xt;
    float* k = xt + key_dim;
    const float* v = xt + 2 * key_dim;
    for (int64_t h = 0; h < hk; ++h) {
      l2_norm(q + h * dk, dk, 1e-6f);
      for (int64_t i = 0; i < dk; ++i) q[h * dk + i] *= q_scale;
      l2_norm(k + h * dk, dk, 1e-6f);
    }
#pragma omp parallel for num_threads(n_threads) if (dk * dv >= 4096 && hv > 1)
    for (int64_t s = 0; s < hv; ++s) {
      const int64_t kh = s % hk;
      const float beta = sigmoid(b[t * hv + s]);
      const float g = w.a[s] * softplus(a[t * hv + s] + w.dt_bias[s]);
      float* os = o.data() + t * value_dim + s * dv;
      deltanet_head_step(state.s.data() + s * dk * dv, q + kh * dk, k + kh * dk, v + s * dv, g,
                         beta, dk, dv, os);
      // Gated RMSNorm: plain weight, times silu(z).
      rms_norm(os, w.norm.data(), os, dv, eps);
      const float* zs = z.data() + t * value_dim + s * dv;
      for (int64_t j = 0; j < dv; ++j) os[j] *= silu(zs[j]);
    }
  }
  matmul(w.out, o.data(), out, n_tokens, threads);
}

}  // namespace lode::cpu
