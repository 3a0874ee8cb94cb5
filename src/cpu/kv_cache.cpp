#include "cpu/kv_cache.h"

#include <algorithm>

#include "kv/codec.h"

namespace lode::cpu {

KvCache::KvCache(kv::Format format, int64_t heads, int64_t head_dim)
    : format_(format),
      heads_(heads),
      head_dim_(head_dim),
      k_row_(kv::row_bytes(kv::layout(format).k, heads, head_dim)),
      v_row_(kv::row_bytes(kv::layout(format).v, heads, head_dim)) {
  kv::check_head_dim(format, head_dim);
}

void KvCache::append(const float* k, const float* v, int64_t n) {
  const size_t k_old = k_.size(), v_old = v_.size();
  k_.resize(k_old + size_t(n * k_row_));
  v_.resize(v_old + size_t(n * v_row_));
  const kv::Layout l = layout();
  const int64_t values = heads_ * head_dim_;
  for (int64_t p = 0; p < n; ++p) {
    kv::encode_row(l.k, k + p * values, heads_, head_dim_, k_.data() + k_old + p * k_row_);
    kv::encode_row(l.v, v + p * values, heads_, head_dim_, v_.data() + v_old + p * v_row_);
  }
}

void KvCache::truncate(int64_t n) {
  if (n >= positions()) return;
  k_.resize(size_t(n * k_row_));
  v_.resize(size_t(n * v_row_));
}

KvCache KvCache::prefix(int64_t n) const {
  KvCache copy;
  copy.format_ = format_;
  copy.heads_ = heads_;
  copy.head_dim_ = head_dim_;
  copy.k_row_ = k_row_;
  copy.v_row_ = v_row_;
  n = std::min(n, positions());
  copy.k_.assign(k_.begin(), k_.begin() + n * k_row_);
  copy.v_.assign(v_.begin(), v_.begin() + n * v_row_);
  return copy;
}

void KvCache::key(int64_t pos, int64_t head, float* out) const {
  kv::decode_head(layout().k, k_.data() + pos * k_row_, heads_, head_dim_, head, out);
}

void KvCache::value(int64_t pos, int64_t head, float* out) const {
  kv::decode_head(layout().v, v_.data() + pos * v_row_, heads_, head_dim_, head, out);
}

}  // namespace lode::cpu
