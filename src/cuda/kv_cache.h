// The K/V cache of a session's sequences on the GPU: for every full-attention layer, K and V stores
// in pages of kKvPagePositions positions (cuda/kv_format.h), and each sequence's page table, shared
// by the layers (the tables one after another, pages_per_sequence() entries each; sequence s owns
// the physical pages [s P, (s + 1) P)). Allocated through the VRAM accountant (as kv).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/kv_format.h"
#include "cuda/vram.h"

namespace lode::cuda {

class KvCache {
 public:
  // Room for max_positions positions (rounded up to whole pages) for each of `sequences` sequences
  // in n_layers layers of n_kv_heads heads of head_dim values, each side in its store's bytes
  // (kv::row_bytes). Fails (lode::Error) when the format cannot hold heads of head_dim values.
  // page_order: the physical page of each logical page within a sequence's own pages (empty: in
  // order; tests scramble it to show nothing depends on the order).
  KvCache(VramAccountant& vram, KvFormat format, int n_layers, int64_t n_kv_heads, int64_t head_dim,
          int64_t max_positions, std::vector<int32_t> page_order = {}, int64_t sequences = 1);

  // Layer `index` of one sequence: its page table.
  KvView layer(int index, int64_t sequence = 0) const;
  // The rows of positions [0, positions) of a sequence in every layer (K then V of layer 0, then
  // layer 1, ...), in logical order and in the format's own bytes: positions * bytes_per_position().
  std::vector<uint8_t> save(int64_t positions, int64_t sequence = 0) const;
  // Writes rows saved by save() (from a cache of the same format and geometry, in any page order).
  void restore(const std::vector<uint8_t>& rows, int64_t positions, int64_t sequence = 0);
  int64_t pages_per_sequence() const { return int64_t(page_order_.size()); }
  int64_t sequences() const { return sequences_; }
  KvFormat format() const { return format_; }
  int n_layers() const { return int(stores_.size() / 2); }
  // Bytes of one position in every layer, K and V.
  size_t bytes_per_position() const;

 private:
  KvFormat format_;
  int64_t k_row_bytes_, v_row_bytes_;
  int64_t sequences_ = 1;
  std::vector<DeviceBuffer> stores_;  // K then V of each layer
  // Copies positions [0, positions) of one store, page by page, to host rows (to_host) or from
  // them (from_host); the other is null.
  void copy_rows(int store, int64_t sequence, int64_t positions, uint8_t* to_host, const uint8_t* from_host) const;
  void check_sequence(int64_t sequence) const;

  DeviceBuffer pages_;
  std::vector<int32_t> page_order_;  // sequence 0's table (sequence s's: these plus s P)
};

}  // namespace lode::cuda
