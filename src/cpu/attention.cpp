#include "cpu/attention.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "cpu/ops.h"

namespace lode::cpu {
namespace {

// Norms and rotates the chunk's q (in place inside qg) and k, and appends k and v to the cache.
void prepare_qkv(const AttentionWeights& w, const model::Qwen35MoeConfig& c, KvCache& cache,
                 std::vector<float>& qg, const std::vector<float>& k, const std::vector<float>& v,
                 int64_t n_tokens, int64_t pos0) {
  const int64_t hd = c.head_dim;
  const float eps = float(c.rms_eps);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < c.n_heads; ++h) {
      float* q = qg.data() + (t * c.n_heads + h) * 2 * hd;  // q half of head h
      rms_norm(q, w.q_norm.data(), q, hd, eps);
      rope_neox(q, c.rope_dims, pos0 + t, c.rope_theta);
    }
  }
  const size_t old = cache.k.size();
  cache.k.insert(cache.k.end(), k.begin(), k.end());
  cache.v.insert(cache.v.end(), v.begin(), v.end());
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      float* kh = cache.k.data() + old + (t * c.n_kv_heads + h) * hd;
      rms_norm(kh, w.k_norm.data(), kh, hd, eps);
      rope_neox(kh, c.rope_dims, pos0 + t, c.rope_theta);
    }
  }
}

// One query head of one token attending to positions [0, n_keys): o = softmax(q K^T * scale) V.
void attend(const float* q, const float* keys, const float* values, int64_t n_keys,
            int64_t stride, int64_t hd, float* scores, float* o) {
  const float scale = 1.0f / std::sqrt(float(hd));
  for (int64_t j = 0; j < n_keys; ++j) scores[j] = dot(q, keys + j * stride, hd) * scale;
  softmax(scores, n_keys);
  for (int64_t d = 0; d < hd; ++d) o[d] = 0.0f;
  for (int64_t j = 0; j < n_keys; ++j) {
    const float p = scores[j];
    const float* vj = values + j * stride;
    for (int64_t d = 0; d < hd; ++d) o[d] += p * vj[d];
  }
}

}  // namespace

void attention_forward(const AttentionWeights& w, const model::Qwen35MoeConfig& c, KvCache& cache,
                       const float* x, float* out, int64_t n_tokens, int64_t pos0, const Compute& compute) {
  const int64_t hd = c.head_dim, kv_dim = c.kv_dim();
  std::vector<float> qg(size_t(n_tokens * 2 * c.q_dim()));
  std::vector<float> k(size_t(n_tokens * kv_dim)), v(size_t(n_tokens * kv_dim));
  matmul(w.q, x, qg.data(), n_tokens, compute);
  matmul(w.k, x, k.data(), n_tokens, compute);
  matmul(w.v, x, v.data(), n_tokens, compute);
  prepare_qkv(w, c, cache, qg, k, v, n_tokens, pos0);

  const int64_t group = c.n_heads / c.n_kv_heads;  // query heads per KV head
  std::vector<float> gated(size_t(n_tokens * c.q_dim()));
  const int64_t n_pairs = n_tokens * c.n_heads;
#pragma omp parallel num_threads(compute.resolved_threads()) if (n_pairs > 1)
  {
    std::vector<float> scores(size_t(pos0 + n_tokens));
#pragma omp for schedule(dynamic)
    for (int64_t i = 0; i < n_pairs; ++i) {
      const int64_t t = i / c.n_heads, h = i % c.n_heads;
      const float* q = qg.data() + (t * c.n_heads + h) * 2 * hd;
      const float* gate = q + hd;
      const int64_t kvh = h / group;
      float* o = gated.data() + (t * c.n_heads + h) * hd;
      attend(q, cache.k.data() + kvh * hd, cache.v.data() + kvh * hd, pos0 + t + 1, kv_dim, hd,
             scores.data(), o);
      for (int64_t d = 0; d < hd; ++d) o[d] *= sigmoid(gate[d]);
    }
  }
  matmul(w.output, gated.data(), out, n_tokens, compute);
}

}  // namespace lode::cpu
