// One attention layer's K/V cache on the CPU, in the session's K/V format (kv/format.h): row p of
// each side holds position p, encoded by the reference codecs (kv/codec.h). Keys are stored
// normed and rotated (RoPE), as attention reads them.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/format.h"

namespace lode::cpu {

class KvCache {
 public:
  KvCache() = default;  // a DeltaNet layer's: holds nothing
  KvCache(kv::Format format, int64_t heads, int64_t head_dim);

  kv::Format format() const { return format_; }
  kv::Layout layout() const { return kv::layout(format_); }
  int64_t positions() const { return k_row_ ? int64_t(k_.size()) / k_row_ : 0; }
  int64_t bytes() const { return int64_t(k_.size() + v_.size()); }
  int64_t row_values() const { return heads_ * head_dim_; }  // values per position and side

  // Appends n positions: k and v are [n][heads * head_dim].
  void append(const float* k, const float* v, int64_t n);
  // Keeps the first n positions.
  void truncate(int64_t n);
  // This cache's first n positions, as a cache of their own.
  KvCache prefix(int64_t n) const;

  // Head `head` of position `pos`, decoded into head_dim floats (a rotated store's values stay
  // rotated: see kv::decode_head).
  void key(int64_t pos, int64_t head, float* out) const;
  void value(int64_t pos, int64_t head, float* out) const;
  // fp32 caches only: the stored rows themselves ([positions][heads * head_dim]), read in place.
  const float* fp32_keys() const { return reinterpret_cast<const float*>(k_.data()); }
  const float* fp32_values() const { return reinterpret_cast<const float*>(v_.data()); }

 private:
  kv::Format format_ = kv::Format::f32;
  int64_t heads_ = 0, head_dim_ = 0;
  int64_t k_row_ = 0, v_row_ = 0;  // bytes per position of each side
  std::vector<uint8_t> k_, v_;
};

}  // namespace lode::cpu
