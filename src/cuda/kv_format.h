// How the full-attention layers' K/V cells are stored on the GPU (../shared/spec/kv-formats.md):
// pages of kKvPagePositions positions reached through a page table, so a sequence's cells can be
// saved, copied and shared without moving them. Every format of kv::Format (shared with the CPU
// engine); each side's rows are laid out as kv/codec.h lays them out (int8 scales and q4 block
// scales inside the row, so they are paged with the codes). The attention kernels take each side's
// store as a compile-time parameter. No CUDA types here.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kv/format.h"

namespace lode::cuda {

using KvFormat = kv::Format;

// Positions per page (the server's prefix checkpoints are 64 tokens apart too).
constexpr int64_t kKvPagePositions = 64;

// One attention layer's cache: K and V stores, each [physical page][kKvPagePositions][row bytes]
// (a row: one side of one position, n_kv_heads * head_dim values in that side's store), and the
// page table (device memory) mapping a logical page (position / kKvPagePositions) to its
// physical page.
struct KvView {
  KvFormat format = KvFormat::f32;
  void* k = nullptr;
  void* v = nullptr;
  const int32_t* pages = nullptr;
  int64_t k_row_bytes = 0, v_row_bytes = 0;
  // A step's rows of several sequences (device memory, [rows]; null: the rows are consecutive
  // positions of the one sequence whose page table is `pages`): row t's page table starts at
  // pages + row_sequence[t] * pages_stride, and the kernels take its position from their position
  // array's entry t rather than the first position plus t.
  const int32_t* row_sequence = nullptr;
  int64_t pages_stride = 0;
};

}  // namespace lode::cuda
