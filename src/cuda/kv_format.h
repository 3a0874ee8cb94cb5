// How the full-attention layers' K/V cells are stored on the GPU (../shared/spec/kv-formats.md):
// the value type of a cell, and pages of kKvPagePositions positions reached through a page table,
// so a sequence's cells can be saved, copied and shared without moving them. fp32 and fp16 for
// now; the attention kernels take the format as a compile-time parameter. No CUDA types here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace lode::cuda {

enum class KvFormat { f32, f16 };

// Positions per page (the server's prefix checkpoints are 64 tokens apart too).
constexpr int64_t kKvPagePositions = 64;

const char* to_string(KvFormat format);          // "fp32", "fp16"
KvFormat parse_kv_format(std::string_view name);  // fails (lode::Error) naming the valid ones
size_t kv_value_bytes(KvFormat format);           // bytes of one stored value

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
