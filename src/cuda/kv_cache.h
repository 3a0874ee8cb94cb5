// The K/V cache of a session's sequences on the GPU: for every full-attention layer, K and V stores
// in pages of kKvPagePositions positions (cuda/kv_format.h), one pool for all sequences, and each
// sequence's page table, shared by the layers (the tables one after another, pages_per_sequence()
// entries each). Which page a position lies in is kv/page_tables.h's bookkeeping: a sequence takes
// pages as it writes (prepare_write) and gives them back when cut short (trim); pages are shared
// between sequences and kept prefixes (KvPrefix) instead of copied, and a sequence about to write
// into a shared page first takes a page of its own. Room is promised by reservation (reserve);
// when no page is free, the oldest prefix that can free one moves its cells to host memory.
// Allocated through the VRAM accountant (as kv).
//
// The copies here run on the default stream, and whatever changes the tables or the cells waits for
// the device before it returns. A caller whose own stream may still read the tables or write the
// cells waits for that stream first (writable() says when prepare_write has anything to do).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cuda/kv_format.h"
#include "cuda/vram.h"
#include "kv/page_tables.h"

namespace lode::cuda {

class KvPrefix;

class KvCache {
 public:
  // Sequences of up to max_positions positions each (rounded up to whole pages), `sequences` of
  // them, in n_layers layers of n_kv_heads heads of head_dim values, each side in its store's bytes
  // (kv::row_bytes); a pool of pool_positions positions (rounded up to whole pages; 0: every
  // sequence's whole context). Fails (lode::Error) when the format cannot hold heads of head_dim
  // values. page_order: the order pages are handed out in (kv::PageTables; empty: in order; tests
  // scramble it to show nothing depends on the order).
  KvCache(VramAccountant& vram, KvFormat format, int n_layers, int64_t n_kv_heads, int64_t head_dim,
          int64_t max_positions, std::vector<int32_t> page_order = {}, int64_t sequences = 1,
          int64_t pool_positions = 0);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // Layer `index` of one sequence: its page table.
  KvView layer(int index, int64_t sequence = 0) const;
  // The rows of positions [0, positions) of a sequence in every layer (K then V of layer 0, then
  // layer 1, ...), in logical order and in the format's own bytes: positions * bytes_per_position().
  std::vector<uint8_t> save(int64_t positions, int64_t sequence = 0) const;
  // Writes rows saved by save() (from a cache of the same format and geometry, in any page order);
  // the sequence's pages past them given back.
  void restore(const std::vector<uint8_t>& rows, int64_t positions, int64_t sequence = 0);
  // Promises the sequence room for `positions` positions (kv::PageTables::reserve); false, changing
  // nothing, when the pool cannot.
  bool reserve(int64_t sequence, int64_t positions);
  // The sequence's pages past its first `positions` positions given back.
  void trim(int64_t sequence, int64_t positions);

  // Whether positions [first, end) of the sequence can be written as they are (no shared page
  // among them): when not, prepare_write must come first.
  bool writable(int64_t sequence, int64_t first, int64_t end) const;
  // The sequence's pages for positions [first, end) made its own: each shared one exchanged for a
  // free page, the rows before `first` on it copied (the sequence's rows end at `first`).
  void prepare_write(int64_t sequence, int64_t first, int64_t end);
  // The sequence's first `positions` positions kept, on the pages they lie in (nothing copied).
  std::shared_ptr<const KvPrefix> keep(int64_t sequence, int64_t positions);
  // The sequence's first positions become the prefix's: its pages taken as they are, or its cells
  // copied back from host memory; its pages past them given back. Fails for a prefix of another
  // cache.
  void resume(const KvPrefix& prefix, int64_t sequence);
  // Pages that only kept prefixes hold (beyond what the sequences map), and the pool's.
  int64_t held_only_pages() const;
  int64_t pages() const;
  int64_t free_pages() const;

  int64_t pages_per_sequence() const;
  int64_t sequences() const;
  KvFormat format() const { return format_; }
  int n_layers() const { return int(stores_.size() / 2); }
  // Bytes of one position in every layer, K and V.
  size_t bytes_per_position() const;
  size_t page_bytes() const { return size_t(kKvPagePositions) * bytes_per_position(); }

  // The bookkeeping, shared with the prefixes (which let go of their pages when they end).
  struct Ledger;

 private:
  int64_t row_bytes(int store) const { return store % 2 == 0 ? k_row_bytes_ : v_row_bytes_; }
  // Copies positions [0, positions) of every store in pages `pages` (by logical page) to host rows
  // (to_host) or from them (from_host); the other is null. Rows as save() lays them out.
  void copy_rows(std::span<const int32_t> pages, int64_t positions, uint8_t* to_host, const uint8_t* from_host) const;
  void upload_table(int64_t sequence);
  // With the ledger locked: the sequence's first `positions` positions become `rows` (save()'s
  // layout), its pages past them given back.
  void write_rows(int64_t sequence, int64_t positions, const uint8_t* rows);
  // prepare_write's, with the ledger locked.
  void make_writable(int64_t sequence, int64_t first, int64_t end);

  KvFormat format_;
  int64_t k_row_bytes_, v_row_bytes_;
  std::vector<DeviceBuffer> stores_;  // K then V of each layer
  DeviceBuffer tables_;                // the page tables on the device
  std::shared_ptr<Ledger> ledger_;
};

// A sequence's first positions kept by a KvCache (KvCache::keep): on the pages they lay in, shared,
// until the cache needs pages and moves the cells to host memory. Immutable to its users; it lets
// go of its pages when it ends (any thread), or of nothing when the cache has ended first.
class KvPrefix {
 public:
  ~KvPrefix();
  KvPrefix(const KvPrefix&) = delete;
  KvPrefix& operator=(const KvPrefix&) = delete;
  int64_t positions() const { return positions_; }
  // Host memory it holds: 0 while its cells are on pages.
  int64_t host_bytes() const;

 private:
  friend class KvCache;
  KvPrefix(std::weak_ptr<KvCache::Ledger> ledger, int64_t hold, int64_t positions)
      : ledger_(std::move(ledger)), hold_(hold), positions_(positions) {}
  std::weak_ptr<KvCache::Ledger> ledger_;  // which cache kept it
  // Guarded by the ledger's mutex (the cache moves the cells out while others read the prefix):
  int64_t hold_;              // the hold on its pages, -1 once on the host
  std::vector<uint8_t> cells_;  // on the host: save()'s layout
  int64_t positions_;
};

}  // namespace lode::cuda
