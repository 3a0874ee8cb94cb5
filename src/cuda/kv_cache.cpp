#include "cuda/kv_cache.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/error.h"

namespace lode::cuda {

void check_on_the_gpu(KvFormat format) {
  if (format != KvFormat::f32 && format != KvFormat::f16)
    fail("--kv {}: the GPU engine holds fp32 or fp16 K/V so far; the CPU engine holds every format "
         "(--backend cpu)", kv::to_string(format));
}

namespace {
size_t value_bytes(KvFormat format) { return format == KvFormat::f16 ? 2 : 4; }
}  // namespace

KvCache::KvCache(VramAccountant& vram, KvFormat format, int n_layers, int64_t row_values, int64_t max_positions,
                 std::vector<int32_t> page_order)
    : format_(format), row_values_(row_values) {
  check_on_the_gpu(format);
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
  const size_t store_bytes = size_t(n_pages * kKvPagePositions * row_values) * value_bytes(format);
  for (int l = 0; l < n_layers; ++l)
    for (const char* side : {"K", "V"})
      stores_.emplace_back(vram, store_bytes, VramUse::kv,
                           std::string(side) + " cache (" + kv::to_string(format) + "), attention layer " + std::to_string(l));
  pages_ = DeviceBuffer(vram, std::max<size_t>(page_order.size(), 1) * sizeof(int32_t), VramUse::kv, "K/V page table");
  copy_to_device(pages_.data(), page_order.data(), page_order.size() * sizeof(int32_t));
}

KvView KvCache::layer(int index) const {
  return {format_, stores_[size_t(2 * index)].data(), stores_[size_t(2 * index + 1)].data(), pages_.as<int32_t>()};
}

size_t KvCache::bytes_per_position() const {
  return stores_.size() * size_t(row_values_) * value_bytes(format_);
}

}  // namespace lode::cuda
