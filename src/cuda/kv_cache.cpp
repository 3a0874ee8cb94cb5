#include "cuda/kv_cache.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/error.h"

namespace lode::cuda {

KvCache::KvCache(VramAccountant& vram, KvFormat format, int n_layers, int64_t n_kv_heads, int64_t head_dim,
                 int64_t max_positions, std::vector<int32_t> page_order, int64_t sequences)
    : format_(format),
      k_row_bytes_(kv::row_bytes(kv::layout(format).k, n_kv_heads, head_dim)),
      v_row_bytes_(kv::row_bytes(kv::layout(format).v, n_kv_heads, head_dim)),
      sequences_(sequences) {
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
  if (sequences < 1) fail("K/V cache: room for {} sequences", sequences);
  const std::string name = kv::to_string(format);
  const int64_t all_pages = n_pages * sequences;
  for (int l = 0; l < n_layers; ++l) {
    stores_.emplace_back(vram, size_t(all_pages * kKvPagePositions * k_row_bytes_), VramUse::kv,
                         "K cache (" + name + "), attention layer " + std::to_string(l));
    stores_.emplace_back(vram, size_t(all_pages * kKvPagePositions * v_row_bytes_), VramUse::kv,
                         "V cache (" + name + "), attention layer " + std::to_string(l));
  }
  std::vector<int32_t> tables(static_cast<size_t>(all_pages));
  for (int64_t s = 0; s < sequences; ++s)
    for (int64_t p = 0; p < n_pages; ++p) tables[size_t(s * n_pages + p)] = int32_t(s * n_pages + page_order[size_t(p)]);
  pages_ = DeviceBuffer(vram, std::max<size_t>(tables.size(), 1) * sizeof(int32_t), VramUse::kv, "K/V page tables");
  copy_to_device(pages_.data(), tables.data(), tables.size() * sizeof(int32_t));
  page_order_ = std::move(page_order);
}

void KvCache::check_sequence(int64_t sequence) const {
  if (sequence < 0 || sequence >= sequences_)
    fail("K/V cache: sequence {} of a cache of {} sequences", sequence, sequences_);
}

void KvCache::copy_rows(int store, int64_t sequence, int64_t positions, uint8_t* to_host,
                        const uint8_t* from_host) const {
  const int64_t row_bytes = store % 2 == 0 ? k_row_bytes_ : v_row_bytes_;
  auto* device = static_cast<uint8_t*>(stores_[size_t(store)].data());
  const int64_t own = sequence * pages_per_sequence();  // the sequence's first physical page
  for (int64_t first = 0; first < positions; first += kKvPagePositions) {
    const int64_t page = own + page_order_[size_t(first / kKvPagePositions)];
    uint8_t* cells = device + page * kKvPagePositions * row_bytes;
    const size_t bytes = size_t(std::min(kKvPagePositions, positions - first) * row_bytes);
    if (to_host) copy_to_host(to_host + first * row_bytes, cells, bytes);
    else copy_to_device(cells, from_host + first * row_bytes, bytes);
  }
}

std::vector<uint8_t> KvCache::save(int64_t positions, int64_t sequence) const {
  check_sequence(sequence);
  if (positions < 0 || positions > int64_t(page_order_.size()) * kKvPagePositions)
    fail("K/V cache: cannot save {} positions of a cache of {}", positions, int64_t(page_order_.size()) * kKvPagePositions);
  std::vector<uint8_t> rows(size_t(positions) * bytes_per_position());
  uint8_t* at = rows.data();
  for (int store = 0; store < int(stores_.size()); ++store) {
    copy_rows(store, sequence, positions, at, nullptr);
    at += positions * (store % 2 == 0 ? k_row_bytes_ : v_row_bytes_);
  }
  return rows;
}

void KvCache::restore(const std::vector<uint8_t>& rows, int64_t positions, int64_t sequence) {
  check_sequence(sequence);
  if (rows.size() != size_t(positions) * bytes_per_position())
    fail("K/V cache: {} bytes do not hold {} positions of this cache ({} bytes each)", rows.size(), positions,
         bytes_per_position());
  if (positions > int64_t(page_order_.size()) * kKvPagePositions)
    fail("K/V cache: {} saved positions do not fit a cache of {}; raise max_context", positions,
         int64_t(page_order_.size()) * kKvPagePositions);
  const uint8_t* at = rows.data();
  for (int store = 0; store < int(stores_.size()); ++store) {
    copy_rows(store, sequence, positions, nullptr, at);
    at += positions * (store % 2 == 0 ? k_row_bytes_ : v_row_bytes_);
  }
}

KvView KvCache::layer(int index, int64_t sequence) const {
  check_sequence(sequence);
  return {format_, stores_[size_t(2 * index)].data(), stores_[size_t(2 * index + 1)].data(),
          pages_.as<int32_t>() + sequence * pages_per_sequence(), k_row_bytes_, v_row_bytes_};
}

size_t KvCache::bytes_per_position() const { return size_t(n_layers()) * size_t(k_row_bytes_ + v_row_bytes_); }

}  // namespace lode::cuda
