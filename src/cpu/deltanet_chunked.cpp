// The chunked (WY / UT-transform) form of the gated delta rule for one value head; see
// deltanet.h for the equations. Exponents are differences of cumulative log-decays G_t - G_i with
// i <= t, never positive, so nothing overflows however strong the decay.
#include <cmath>
#include <vector>

#include "cpu/deltanet.h"
#include "cpu/matmul.h"

namespace lode::cpu {
namespace {

// u[dv] = S^T x for a state S [dk][dv].
void state_times(const float* s, const float* x, int64_t dk, int64_t dv, float* u) {
  for (int64_t j = 0; j < dv; ++j) u[j] = 0.0f;
  for (int64_t i = 0; i < dk; ++i) {
    const float xi = x[i];
    const float* row = s + i * dv;
    for (int64_t j = 0; j < dv; ++j) u[j] += row[j] * xi;
  }
}

}  // namespace

void deltanet_head_chunk(float* s, const float* q, const float* k, int64_t qk_stride,
                         const float* v, int64_t v_stride, const float* g, const float* beta,
                         int64_t L, int64_t dk, int64_t dv, float* o, int64_t o_stride) {
  std::vector<float> G(static_cast<size_t>(L)), d(static_cast<size_t>(L * dv)), u(static_cast<size_t>(dv));
  float cumulative = 0.0f;
  for (int64_t t = 0; t < L; ++t) G[t] = (cumulative += g[t]);

  // d_t by forward substitution (each d_t needs the earlier ones).
  for (int64_t t = 0; t < L; ++t) {
    const float* kt = k + t * qk_stride;
    const float* vt = v + t * v_stride;
    float* dt = d.data() + t * dv;
    state_times(s, kt, dk, dv, u.data());
    const float decay = std::exp(G[t]);
    for (int64_t j = 0; j < dv; ++j) dt[j] = beta[t] * (vt[j] - decay * u[j]);
    for (int64_t i = 0; i < t; ++i) {
      const float coef = beta[t] * std::exp(G[t] - G[i]) * dot(kt, k + i * qk_stride, dk);
      const float* di = d.data() + i * dv;
      for (int64_t j = 0; j < dv; ++j) dt[j] -= coef * di[j];
    }
  }
  // Outputs from the state before the chunk plus the chunk's own writes.
  for (int64_t t = 0; t < L; ++t) {
    const float* qt = q + t * qk_stride;
    float* ot = o + t * o_stride;
    state_times(s, qt, dk, dv, u.data());
    const float decay = std::exp(G[t]);
    for (int64_t j = 0; j < dv; ++j) ot[j] = decay * u[j];
    for (int64_t i = 0; i <= t; ++i) {
      const float coef = std::exp(G[t] - G[i]) * dot(qt, k + i * qk_stride, dk);
      const float* di = d.data() + i * dv;
      for (int64_t j = 0; j < dv; ++j) ot[j] += coef * di[j];
    }
  }
  // The state after the chunk.
  const float total = std::exp(G[L - 1]);
  for (int64_t i = 0; i < dk * dv; ++i) s[i] *= total;
  for (int64_t t = 0; t < L; ++t) {
    const float coef = std::exp(G[L - 1] - G[t]);
    const float* kt = k + t * qk_stride;
    const float* dt = d.data() + t * dv;
    for (int64_t i = 0; i < dk; ++i) {
      const float ki = coef * kt[i];
      float* row = s + i * dv;
      for (int64_t j = 0; j < dv; ++j) row[j] += ki * dt[j];
    }
  }
}

}  // namespace lode::cpu
