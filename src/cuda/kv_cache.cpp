#include "cuda/kv_cache.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>
#include <string>

#include "core/error.h"

namespace lode::cuda {

struct KvCache::Ledger {
  explicit Ledger(kv::PageTables t) : tables(std::move(t)) {}
  std::mutex mutex;
  kv::PageTables tables;
  std::map<int64_t, KvPrefix*> prefixes;  // by hold: the prefixes whose cells are on pages
};

KvCache::KvCache(VramAccountant& vram, KvFormat format, int n_layers, int64_t n_kv_heads, int64_t head_dim,
                 int64_t max_positions, std::vector<int32_t> page_order, int64_t sequences, int64_t pool_positions)
    : format_(format),
      k_row_bytes_(kv::row_bytes(kv::layout(format).k, n_kv_heads, head_dim)),
      v_row_bytes_(kv::row_bytes(kv::layout(format).v, n_kv_heads, head_dim)) {
  kv::check_head_dim(format, head_dim);
  const int64_t n_pages = (max_positions + kKvPagePositions - 1) / kKvPagePositions;
  if (page_order.empty()) {
    page_order.resize(size_t(n_pages));
    std::iota(page_order.begin(), page_order.end(), 0);
  }
  if (int64_t(page_order.size()) != n_pages)
    fail("K/V cache: the page order must be a permutation of the {} pages", n_pages);
  const int64_t pool_pages = (pool_positions + kKvPagePositions - 1) / kKvPagePositions;
  ledger_ = std::make_shared<Ledger>(kv::PageTables(sequences, std::move(page_order), kKvPagePositions, pool_pages));
  const std::string name = kv::to_string(format);
  const int64_t all_pages = ledger_->tables.pages();
  for (int l = 0; l < n_layers; ++l) {
    stores_.emplace_back(vram, size_t(all_pages * kKvPagePositions * k_row_bytes_), VramUse::kv,
                         "K cache (" + name + "), attention layer " + std::to_string(l));
    stores_.emplace_back(vram, size_t(all_pages * kKvPagePositions * v_row_bytes_), VramUse::kv,
                         "V cache (" + name + "), attention layer " + std::to_string(l));
  }
  const size_t entries = size_t(sequences * ledger_->tables.pages_per_sequence());
  tables_ = DeviceBuffer(vram, std::max<size_t>(entries, 1) * sizeof(int32_t), VramUse::kv, "K/V page tables");
  for (int64_t s = 0; s < sequences; ++s) upload_table(s);
  synchronize();
}

// Prefixes that outlive the cache keep nothing (their cells were on its pages): the ledger outlives
// it only while one of them is letting go of its hold.
KvCache::~KvCache() = default;

int64_t KvCache::pages_per_sequence() const { return ledger_->tables.pages_per_sequence(); }
int64_t KvCache::sequences() const { return ledger_->tables.sequences(); }

void KvCache::upload_table(int64_t sequence) {
  // Entries no page backs point at page 0 on the device: the kernels read only the positions a
  // sequence holds, but a tile may look up the page past them.
  std::vector<int32_t> table(ledger_->tables.table(sequence).begin(), ledger_->tables.table(sequence).end());
  std::replace(table.begin(), table.end(), kv::PageTables::kUnmapped, 0);
  copy_to_device(tables_.as<int32_t>() + sequence * int64_t(table.size()), table.data(), table.size() * sizeof(int32_t));
}

void KvCache::copy_rows(std::span<const int32_t> pages, int64_t positions, uint8_t* to_host,
                        const uint8_t* from_host) const {
  size_t at = 0;  // the store's rows start here in the host layout
  for (int store = 0; store < int(stores_.size()); ++store) {
    const int64_t row = row_bytes(store);
    auto* device = static_cast<uint8_t*>(stores_[size_t(store)].data());
    // A run of pages that follow one another in the store too (as a pool hands them out until it
    // churns) is one copy: a long prefix moved to host memory is then a few copies, not one a page.
    for (int64_t first = 0; first < positions;) {
      const int32_t page = pages[size_t(first / kKvPagePositions)];
      if (page == kv::PageTables::kUnmapped) fail("K/V cache: positions from {} were never written", first);
      int64_t end = std::min(first + kKvPagePositions, positions);
      while (end < positions && pages[size_t(end / kKvPagePositions)] == page + int32_t((end - first) / kKvPagePositions))
        end = std::min(end + kKvPagePositions, positions);
      uint8_t* cells = device + page * kKvPagePositions * row;
      const size_t bytes = size_t((end - first) * row);
      if (to_host) copy_to_host(to_host + at + first * row, cells, bytes);
      else copy_to_device(cells, from_host + at + first * row, bytes);
      first = end;
    }
    at += size_t(positions * row);
  }
}

std::vector<uint8_t> KvCache::save(int64_t positions, int64_t sequence) const {
  std::lock_guard lock(ledger_->mutex);
  const std::span<const int32_t> table = ledger_->tables.table(sequence);
  if (positions < 0 || positions > int64_t(table.size()) * kKvPagePositions)
    fail("K/V cache: cannot save {} positions of a cache of {}", positions, int64_t(table.size()) * kKvPagePositions);
  std::vector<uint8_t> rows(size_t(positions) * bytes_per_position());
  copy_rows(table, positions, rows.data(), nullptr);
  return rows;
}

void KvCache::restore(const std::vector<uint8_t>& rows, int64_t positions, int64_t sequence) {
  std::lock_guard lock(ledger_->mutex);
  const int64_t capacity = ledger_->tables.pages_per_sequence() * kKvPagePositions;
  if (rows.size() != size_t(positions) * bytes_per_position())
    fail("K/V cache: {} bytes do not hold {} positions of this cache ({} bytes each)", rows.size(), positions,
         bytes_per_position());
  if (positions > capacity)
    fail("K/V cache: {} saved positions do not fit a cache of {}; raise max_context", positions, capacity);
  write_rows(sequence, positions, rows.data());
}

void KvCache::write_rows(int64_t sequence, int64_t positions, const uint8_t* rows) {
  ledger_->tables.trim(sequence, positions);  // (first: what it gives back counts for the promise)
  make_writable(sequence, 0, positions);
  upload_table(sequence);  // (the trim's, where nothing else changed)
  copy_rows(ledger_->tables.table(sequence), positions, nullptr, rows);
  synchronize();  // (an upload from pageable memory returns once it is staged)
}

bool KvCache::reserve(int64_t sequence, int64_t positions) {
  std::lock_guard lock(ledger_->mutex);
  return ledger_->tables.reserve(sequence, positions);
}

void KvCache::trim(int64_t sequence, int64_t positions) {
  std::lock_guard lock(ledger_->mutex);
  ledger_->tables.trim(sequence, positions);
  upload_table(sequence);
  synchronize();
}

bool KvCache::writable(int64_t sequence, int64_t first, int64_t end) const {
  std::lock_guard lock(ledger_->mutex);
  return ledger_->tables.first_unwritable(sequence, first, end) < 0;
}

void KvCache::prepare_write(int64_t sequence, int64_t first, int64_t end) {
  std::lock_guard lock(ledger_->mutex);
  make_writable(sequence, first, end);
}

void KvCache::make_writable(int64_t sequence, int64_t first, int64_t end) {
  Ledger& l = *ledger_;
  // A prefix given up for a free page: its cells to the host, then its pages let go.
  const auto give_up = [&](int64_t hold) {
    KvPrefix& prefix = *l.prefixes.at(hold);
    prefix.cells_.resize(size_t(prefix.positions_) * bytes_per_position());
    copy_rows(l.tables.held(hold), prefix.positions_, prefix.cells_.data(), nullptr);
    prefix.hold_ = -1;
    l.prefixes.erase(hold);
    l.tables.release(hold);
  };
  // A page taken over: the rows before the write, in every store.
  const auto copy = [&](kv::PageTables::Move move, int64_t rows) {
    for (int store = 0; store < int(stores_.size()); ++store) {
      const int64_t page = kKvPagePositions * row_bytes(store);
      auto* device = static_cast<uint8_t*>(stores_[size_t(store)].data());
      copy_on_device(device + move.to * page, device + move.from * page, size_t(rows * row_bytes(store)));
    }
  };
  // A copy on the device and an upload from pageable memory may still be running: the step that
  // writes next runs on another stream. A refusal part way leaves pages taken: the device's table
  // follows the host's either way, or a later write would go where the device's old entry points.
  try {
    if (!l.tables.make_writable(sequence, first, end, give_up, copy)) return;
  } catch (...) {
    upload_table(sequence);
    synchronize();
    throw;
  }
  upload_table(sequence);
  synchronize();
}

std::shared_ptr<const KvPrefix> KvCache::keep(int64_t sequence, int64_t positions) {
  // Made before the lock, holding nothing yet: if what follows fails, its destructor (which takes
  // the lock) runs after the lock is let go.
  std::shared_ptr<KvPrefix> prefix(new KvPrefix(ledger_, -1, positions));
  std::lock_guard lock(ledger_->mutex);
  const int64_t hold = ledger_->tables.hold(sequence, positions);
  try {
    ledger_->prefixes[hold] = prefix.get();
  } catch (...) {
    ledger_->tables.release(hold);
    throw;
  }
  prefix->hold_ = hold;
  return prefix;
}

void KvCache::resume(const KvPrefix& prefix, int64_t sequence) {
  if (prefix.ledger_.lock() != ledger_) fail("K/V cache: the prefix was kept by another cache");
  std::lock_guard lock(ledger_->mutex);
  if (prefix.hold_ < 0) return write_rows(sequence, prefix.positions_, prefix.cells_.data());
  ledger_->tables.adopt(sequence, prefix.hold_);  // (its pages and only those)
  upload_table(sequence);
  synchronize();
}

int64_t KvCache::held_only_pages() const {
  std::lock_guard lock(ledger_->mutex);
  return ledger_->tables.held_only_pages();
}

int64_t KvCache::pages() const { return ledger_->tables.pages(); }

int64_t KvCache::free_pages() const {
  std::lock_guard lock(ledger_->mutex);
  return ledger_->tables.free_pages();
}

KvView KvCache::layer(int index, int64_t sequence) const {
  const int64_t per_sequence = pages_per_sequence();
  if (sequence < 0 || sequence >= sequences())
    fail("K/V cache: sequence {} of a cache of {} sequences", sequence, sequences());
  return {format_, stores_[size_t(2 * index)].data(), stores_[size_t(2 * index + 1)].data(),
          tables_.as<int32_t>() + sequence * per_sequence, k_row_bytes_, v_row_bytes_};
}

size_t KvCache::bytes_per_position() const { return size_t(n_layers()) * size_t(k_row_bytes_ + v_row_bytes_); }

KvPrefix::~KvPrefix() {
  const std::shared_ptr<KvCache::Ledger> ledger = ledger_.lock();
  if (!ledger) return;
  std::lock_guard lock(ledger->mutex);
  if (hold_ < 0) return;
  ledger->prefixes.erase(hold_);
  ledger->tables.release(hold_);
}

int64_t KvPrefix::host_bytes() const {
  const std::shared_ptr<KvCache::Ledger> ledger = ledger_.lock();
  if (!ledger) return int64_t(cells_.size());
  std::lock_guard lock(ledger->mutex);
  return int64_t(cells_.size());
}

}  // namespace lode::cuda
