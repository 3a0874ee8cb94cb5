#include "cpu/moe.h"

#include <algorithm>
#include <numeric>

#include "cpu/matmul.h"
#include "cpu/ops.h"

namespace lode::cpu {

Route route(const float* logits, int64_t n_experts, int64_t k) {
  std::vector<float> p(logits, logits + n_experts);
  softmax(p.data(), n_experts);
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  Route r;
  r.experts.assign(order.begin(), order.begin() + k);
  float sum = 0.0f;
  for (int32_t e : r.experts) sum += p[e];
  for (int32_t e : r.experts) r.weights.push_back(p[e] / sum);
  return r;
}

namespace {

// y [n, hidden] = down(silu(gate(x)) * up(x)) for n rows of x [n, hidden].
void ffn(const model::MatrixView& gate, const model::MatrixView& up, const model::MatrixView& down, const float* x,
         float* y, int64_t n, const Compute& compute) {
  const int64_t ff = gate.rows;
  std::vector<float> g(size_t(n * ff)), u(size_t(n * ff));
  matmul(gate, x, g.data(), n, compute);
  matmul(up, x, u.data(), n, compute);
  for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
  matmul(down, g.data(), y, n, compute);
}

}  // namespace

void moe_forward(const model::MoeWeights& w, const model::Qwen35MoeConfig& c, const float* x,
                 float* out, int64_t n_tokens, const Compute& compute) {
  const int64_t hidden = c.hidden, k = c.n_experts_used;
  std::vector<float> logits(size_t(n_tokens * c.n_experts));
  matmul(w.router, x, logits.data(), n_tokens, compute);
  std::vector<Route> routes;
  for (int64_t t = 0; t < n_tokens; ++t) {
    routes.push_back(route(logits.data() + t * c.n_experts, c.n_experts, k));
  }

  // Per expert, the (token, slot) pairs that chose it; each expert runs once over its tokens.
  std::vector<std::vector<int64_t>> users(size_t(c.n_experts));
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) users[size_t(routes[t].experts[j])].push_back(t * k + j);
  }
  std::vector<float> expert_out(size_t(n_tokens * k * hidden));  // [token][slot][hidden]
  std::vector<float> xs, ys;
  for (int64_t e = 0; e < c.n_experts; ++e) {
    const std::vector<int64_t>& u = users[size_t(e)];
    if (u.empty()) continue;
    const int64_t n = int64_t(u.size());
    xs.resize(size_t(n * hidden));
    ys.resize(size_t(n * hidden));
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(x + (u[i] / k) * hidden, hidden, xs.data() + i * hidden);
    }
    ffn(w.gate.expert(e), w.up.expert(e), w.down.expert(e), xs.data(), ys.data(), n, compute);
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(ys.data() + i * hidden, hidden, expert_out.data() + u[i] * hidden);
    }
  }

  std::vector<float> shared(size_t(n_tokens * hidden), 0.0f);
  if (c.shared_ff > 0) {
    ffn(w.shared_gate, w.shared_up, w.shared_down, x, shared.data(), n_tokens, compute);
  }
  // Summed in slot order then the shared expert, the same for every token whatever the chunk.
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* o = out + t * hidden;
    std::fill_n(o, hidden, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float wj = routes[t].weights[j];
      const float* y = expert_out.data() + (t * k + j) * hidden;
      for (int64_t i = 0; i < hidden; ++i) o[i] += wj * y[i];
    }
    if (c.shared_ff > 0) {
      const float s = sigmoid(dot(w.shared_gate_inp.data(), x + t * hidden, hidden));
      const float* y = shared.data() + t * hidden;
      for (int64_t i = 0; i < hidden; ++i) o[i] += s * y[i];
    }
  }
}

}  // namespace lode::cpu
