#include "cuda/kv_cache.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/error.h"

namespace lode::cuda {

KvCache::KvCache(VramAccountant& vram, KvFormat format, int n_layers, int64_t n_kv_heads, int64_t head_dim,
                 int64_t max_positions, std::vector<int32_t> page_order)
    : format_(format),
      k_row_bytes_(kv::row_bytes(kv::layout(format).k, n_kv_heads, head_dim)),
      v_row_bytes_(kv::row_bytes(kv::layout(format).v, n_kv_heads, head_dim)) {
  kv::check_head_dim(format, head_dim);
  const int64_t n_pages = (max_positions + kKvPagePositions - 1) / kKvPagePositions;
  if (page_order.empty()) {
    page_order.resize(size_t(n_pages));
    std::iota(page_order.begin(), page_order.end(), 0);
  }
  std::vector<int32_t> sorted = page_order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t p = 0; p < int64_t(sorted.size()); ++p)
    if (sorted[size_t(p)] != p || int64_t(sorted.size()) != n_pages)
      fail("K/V cache: the page order must be a permutation of the {} pages", n_pages);
  const std::string name = kv::to_string(format);
  for (int l = 0; l < n_layers; ++l) {
    stores_.emplace_back(vram, size_t(n_pages * kKvPagePositions * k_row_bytes_), VramUse::kv,
                         "K cache (" + name + "), attention layer " + std::to_string(l));
    stores_.emplace_back(vram, size_t(n_pages * kKvPagePositions * v_row_bytes_), VramUse::kv,
                         "V cache (" + name + "), attention layer " + std::to_string(l));
  }
  pages_ = DeviceBuffer(vram, std::max<size_t>(page_order.size(), 1) * sizeof(int32_t), VramUse::kv, "K/V page table");
  copy_to_device(pages_.data(), page_order.data(), page_order.size() * sizeof(int32_t));
}

KvView KvCache::layer(int index) const {
  return {format_, stores_[size_t(2 * index)].data(), stores_[size_t(2 * index + 1)].data(), pages_.as<int32_t>(),
          k_row_bytes_, v_row_bytes_};
}

size_t KvCache::bytes_per_position() const { return size_t(n_layers()) * size_t(k_row_bytes_ + v_row_bytes_); }

}  // namespace lode::cuda
