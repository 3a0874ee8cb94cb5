// How the full-attention layers' K/V cells are stored on the GPU (../shared/spec/kv-formats.md):
// pages of kKvPagePositions positions reached through a page table, so a sequence's cells can be
// saved, copied and shared without moving them. The GPU holds fp32 and fp16 so far (the formats
// are kv::Format, shared with the CPU engine, which holds them all); the attention kernels take
// the format as a compile-time parameter. No CUDA types here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kv/format.h"

namespace lode::cuda {

using KvFormat = kv::Format;

// Positions per page (the server's prefix checkpoints are 64 tokens apart too).
constexpr int64_t kKvPagePositions = 64;

// Fails (lode::Error) for a format the GPU does not hold yet, saying what to do instead.
void check_on_the_gpu(KvFormat format);

// One attention layer's cache: K and V stores, each [physical page][kKvPagePositions][row] values
// of `format` (row: n_kv_heads * head_dim), and the page table (device memory) mapping a logical
// page (position / kKvPagePositions) to its physical page.
struct KvView {
  KvFormat format = KvFormat::f32;
  void* k = nullptr;
  void* v = nullptr;
  const int32_t* pages = nullptr;
};

}  // namespace lode::cuda
