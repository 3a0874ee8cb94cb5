#include "cpu/attention.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/ops.h"
#include "kv/codec.h"

namespace lode::cpu {
namespace {

// Norms and rotates (RoPE) the chunk's q (in place inside qg) and k; for a cache whose keys are
// stored Hadamard-rotated, q is rotated too, so that <Hq, Hk> = <q, k>.
void prepare_k(const model::AttentionWeights& w, const model::Qwen35MoeConfig& c, std::vector<float>& k,
               int64_t n_tokens, int64_t pos0) {
  const int64_t hd = c.head_dim;
  const float eps = float(c.rms_eps);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      float* kh = k.data() + (t * c.n_kv_heads + h) * hd;
      rms_norm(kh, w.k_norm.data(), kh, hd, eps);
      rope_neox(kh, c.rope_dims, pos0 + t, c.rope_theta);
    }
}

void prepare_qk(const model::AttentionWeights& w, const model::Qwen35MoeConfig& c, bool rotate_q, std::vector<float>& qg,
                std::vector<float>& k, int64_t n_tokens, int64_t pos0) {
  const int64_t hd = c.head_dim;
  const float eps = float(c.rms_eps);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < c.n_heads; ++h) {
      float* q = qg.data() + (t * c.n_heads + h) * 2 * hd;  // q half of head h
      rms_norm(q, w.q_norm.data(), q, hd, eps);
      rope_neox(q, c.rope_dims, pos0 + t, c.rope_theta);
      if (rotate_q) kv::hadamard(q, hd);
    }
  prepare_k(w, c, k, n_tokens, pos0);
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

// Where attention reads one KV head's keys and values: rows of `stride` floats.
struct HeadRows {
  const float* keys;
  const float* values;
  int64_t stride;
};

// KV head kvh of positions [0, n): an fp32 cache in place; any other format decoded once into
// `keys` and `values` (rotated stores stay rotated).
HeadRows head_rows(const KvCache& cache, int64_t kvh, int64_t n, int64_t hd, std::vector<float>& keys,
                   std::vector<float>& values, int threads) {
  if (cache.format() == kv::Format::f32) {
    return {cache.fp32_keys() + kvh * hd, cache.fp32_values() + kvh * hd, cache.row_values()};
  }
  keys.resize(size_t(n * hd));
  values.resize(size_t(n * hd));
#pragma omp parallel for num_threads(threads) if (n > 64)
  for (int64_t p = 0; p < n; ++p) {
    cache.key(p, kvh, keys.data() + p * hd);
    cache.value(p, kvh, values.data() + p * hd);
  }
  return {keys.data(), values.data(), hd};
}

}  // namespace

void attention_append_kv(const model::AttentionWeights& w, const model::Qwen35MoeConfig& c, KvCache& cache,
                         const float* x, int64_t n_tokens, int64_t pos0, const Compute& compute, int64_t rope_shift) {
  std::vector<float> k(size_t(n_tokens * c.kv_dim())), v(size_t(n_tokens * c.kv_dim()));
  matmul(w.k, x, k.data(), n_tokens, compute);
  matmul(w.v, x, v.data(), n_tokens, compute);
  prepare_k(w, c, k, n_tokens, pos0 + rope_shift);
  cache.append(k.data(), v.data(), n_tokens);
}

void attention_forward(const model::AttentionWeights& w, const model::Qwen35MoeConfig& c, KvCache& cache,
                       const float* x, float* out, int64_t n_tokens, int64_t pos0, const Compute& compute,
                       int64_t rope_shift) {
  const int64_t hd = c.head_dim;
  std::vector<float> qg(size_t(n_tokens * 2 * c.q_dim()));
  std::vector<float> k(size_t(n_tokens * c.kv_dim())), v(size_t(n_tokens * c.kv_dim()));
  matmul(w.q, x, qg.data(), n_tokens, compute);
  matmul(w.k, x, k.data(), n_tokens, compute);
  matmul(w.v, x, v.data(), n_tokens, compute);
  const kv::Layout layout = cache.layout();
  prepare_qk(w, c, kv::is_rotated(layout.k), qg, k, n_tokens, pos0 + rope_shift);
  cache.append(k.data(), v.data(), n_tokens);

  // One KV head at a time: its keys and values read from the cache, then every query head of its
  // group attends over them.
  const int64_t group = c.n_heads / c.n_kv_heads;  // query heads per KV head
  const int64_t n_keys = pos0 + n_tokens, n_pairs = n_tokens * group;
  std::vector<float> gated(size_t(n_tokens * c.q_dim())), keys, values;
  for (int64_t kvh = 0; kvh < c.n_kv_heads; ++kvh) {
    const HeadRows rows = head_rows(cache, kvh, n_keys, hd, keys, values, compute.resolved_threads());
#pragma omp parallel num_threads(compute.resolved_threads()) if (n_pairs > 1)
    {
      std::vector<float> scores(static_cast<size_t>(n_keys));
#pragma omp for schedule(dynamic)
      for (int64_t i = 0; i < n_pairs; ++i) {
        const int64_t t = i / group, h = kvh * group + i % group;
        const float* q = qg.data() + (t * c.n_heads + h) * 2 * hd;
        const float* gate = q + hd;
        float* o = gated.data() + (t * c.n_heads + h) * hd;
        attend(q, rows.keys, rows.values, pos0 + t + 1, rows.stride, hd, scores.data(), o);
        if (kv::is_rotated(layout.v)) kv::hadamard(o, hd);  // the values were H·v: back to v
        for (int64_t d = 0; d < hd; ++d) o[d] *= sigmoid(gate[d]);
      }
    }
  }
  matmul(w.output, gated.data(), out, n_tokens, compute);
}

}  // namespace lode::cpu
