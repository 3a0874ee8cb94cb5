#include "cuda/vram.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "cuda/device.h"
#include "cuda/errors.h"
#include "plan/memory_plan.h"

namespace lode::cuda {

namespace {

double mib(size_t bytes) { return double(bytes) / double(1 << 20); }

}  // namespace

const char* to_string(VramUse use) {
  switch (use) {
    case VramUse::weights: return "weights";
    case VramUse::experts: return "experts";
    case VramUse::kv: return "kv";
    case VramUse::state: return "state";
    case VramUse::scratch: return "scratch";
  }
  return "?";
}

VramAccountant::VramAccountant(size_t budget_bytes, int device) : budget_(budget_bytes), device_(device) {
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess || count <= device)
    fail_no_gpu(err != cudaSuccess ? cudaGetErrorString(err)
                                   : fmt::format("{} device(s), asked for device {}", count, device));
  check_cuda(cudaSetDevice(device), fmt::format("selecting device {}", device));
  if (const std::string missing = kernels_missing_for(device); !missing.empty()) fail("{}", missing);
  if (budget_ == 0) {
    size_t free = 0, total = 0;
    check_cuda(cudaMemGetInfo(&free, &total), "reading free device memory");
    budget_ = plan::default_budget(free, total);
  }
}

VramAccountant::~VramAccountant() {
  for (auto& [pointer, block] : blocks_) cudaFree(pointer);
}

void* VramAccountant::allocate(size_t bytes, VramUse use, std::string_view what) {
  std::lock_guard lock(mutex_);
  if (held_ + bytes > budget_)
    throw VramShortfall(fmt::format(
        "VRAM budget: {} ({}) needs {:.1f} MiB but only {:.1f} MiB of the {:.1f} MiB budget are left: short by "
        "{:.1f} MiB (holding {}; raise --vram-budget, free the GPU, or use a smaller model or context)",
        what, to_string(use), mib(bytes), mib(budget_ - held_), mib(budget_), mib(held_ + bytes - budget_),
        report_locked()));
  void* pointer = nullptr;
  check_cuda(cudaSetDevice(device_), "selecting the device");
  if (const cudaError_t err = cudaMalloc(&pointer, std::max<size_t>(bytes, 1)); err != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it, or the next launch check reports it again
    fail("CUDA: allocating {:.1f} MiB for {} failed within the budget ({}): the device has less free memory "
         "than the budget assumed; lower --vram-budget", mib(bytes), what, cudaGetErrorString(err));
  }
  blocks_[pointer] = {bytes, use};
  held_ += bytes;
  by_use_[size_t(use)] += bytes;
  peak_ = std::max(peak_, held_);
  return pointer;
}

void VramAccountant::release(void* pointer) {
  if (!pointer) return;
  std::lock_guard lock(mutex_);
  const auto it = blocks_.find(pointer);
  if (it == blocks_.end()) fail("VRAM accountant: releasing memory it did not allocate");
  held_ -= it->second.bytes;
  by_use_[size_t(it->second.use)] -= it->second.bytes;
  blocks_.erase(it);
  cudaFree(pointer);
}

size_t VramAccountant::held() const {
  std::lock_guard lock(mutex_);
  return held_;
}

size_t VramAccountant::held(VramUse use) const {
  std::lock_guard lock(mutex_);
  return by_use_[size_t(use)];
}

size_t VramAccountant::peak() const {
  std::lock_guard lock(mutex_);
  return peak_;
}

std::string VramAccountant::report() const {
  std::lock_guard lock(mutex_);
  return report_locked();
}

std::string VramAccountant::report_locked() const {
  std::string out;
  for (size_t u = 0; u < kVramUses; ++u)
    out += fmt::format("{}{} {:.1f} MiB", u ? ", " : "", to_string(VramUse(u)), mib(by_use_[u]));
  return out + fmt::format(" of a {:.1f} MiB budget", mib(budget_));
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    vram_ = std::exchange(other.vram_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (vram_ && data_) vram_->release(data_);
  vram_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

void copy_to_device(void* device, const void* host, size_t bytes) {
  check_cuda(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "copy to the device");
}

void copy_mapped_to_device(void* device, const void* host, size_t bytes) {
  const cudaError_t err = cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice);
  if (err == cudaSuccess) return;
  cudaGetLastError();
  if (err != cudaErrorInvalidValue) check_cuda(err, "copy to the device");
  constexpr size_t kBounce = size_t(64) << 20;
  std::vector<uint8_t> bounce(std::min(bytes, kBounce));
  for (size_t at = 0; at < bytes; at += bounce.size()) {
    const size_t n = std::min(bounce.size(), bytes - at);
    std::memcpy(bounce.data(), static_cast<const uint8_t*>(host) + at, n);
    copy_to_device(static_cast<uint8_t*>(device) + at, bounce.data(), n);
  }
}

void copy_to_host(void* host, const void* device, size_t bytes) {
  check_cuda(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "copy from the device");
}

void copy_on_device(void* to, const void* from, size_t bytes) {
  check_cuda(cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToDevice), "copy on the device");
}

void synchronize() { check_cuda(cudaDeviceSynchronize(), "running kernels"); }

}  // namespace lode::cuda
