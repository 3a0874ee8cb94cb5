// Every byte lode allocates on the GPU goes through one VramAccountant: it knows the budget
// (--vram-budget, default: what the device has free minus a margin), says clearly how many MiB are
// missing when something does not fit, and reports what it holds by use. Only compiled with CUDA;
// the interface has no CUDA types, so host code compiled by g++ can use it.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace lode::cuda {

// What VramAccountant::allocate throws when an allocation would exceed the budget (callers that
// can make do with less, like the prompt pass's scratch, catch it and ask for less).
class VramShortfall : public BudgetShortfall {
 public:
  using BudgetShortfall::BudgetShortfall;
};

enum class VramUse { weights, experts, kv, state, scratch };
constexpr size_t kVramUses = 5;
const char* to_string(VramUse use);

class VramAccountant {
 public:
  // budget_bytes 0: the device's free memory now, less a margin (512 MiB, or 5% when larger) for
  // the CUDA context, cuBLAS workspaces and other processes. Fails when there is no device.
  explicit VramAccountant(size_t budget_bytes = 0, int device = 0);
  ~VramAccountant();  // releases whatever is still held
  VramAccountant(const VramAccountant&) = delete;
  VramAccountant& operator=(const VramAccountant&) = delete;

  // Device memory for `what` (named in errors). Fails when it would exceed the budget
  // (VramShortfall, saying how many MiB are short), or when the device itself is out of memory.
  void* allocate(size_t bytes, VramUse use, std::string_view what);
  void release(void* pointer);  // null: nothing

  size_t budget() const { return budget_; }
  size_t held() const;
  size_t held(VramUse use) const;
  size_t peak() const;
  std::string report() const;  // "weights 812.0 MiB, kv 64.0 MiB, ... of a 130000.0 MiB budget"

 private:
  struct Block {
    size_t bytes;
    VramUse use;
  };
  std::string report_locked() const;
  mutable std::mutex mutex_;
  size_t budget_ = 0;
  int device_ = 0;
  size_t held_ = 0, peak_ = 0;
  std::array<size_t, kVramUses> by_use_{};
  std::unordered_map<void*, Block> blocks_;
};

// One allocation, released when it goes out of scope.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(VramAccountant& vram, size_t bytes, VramUse use, std::string_view what)
      : vram_(&vram), data_(vram.allocate(bytes, use, what)), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset();
  void* data() const { return data_; }
  template <class T> T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  VramAccountant* vram_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Synchronous copies (tests, uploads); fail with the runtime's message.
void copy_to_device(void* device, const void* host, size_t bytes);
// copy_to_device from a model file's mapping: where the runtime refuses the source because it
// straddles the edge of pages another session's expert tier registered in place
// (cuda/expert_tier.h pins the experts' pages of the same mapping), through a bounce buffer.
void copy_mapped_to_device(void* device, const void* host, size_t bytes);
void copy_to_host(void* host, const void* device, size_t bytes);
void copy_on_device(void* to, const void* from, size_t bytes);
// Waits for the device; fails with the first error a kernel raised.
void synchronize();

}  // namespace lode::cuda
