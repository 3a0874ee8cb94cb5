#include "cuda/pinned_floats.h"

#include <cuda_runtime.h>

#include <new>
#include <utility>

namespace lode::cuda {

namespace {

// (A failure is not worth a throw, and must not stay as the last error for a launch to report.)
void free_block(void* block) {
  if (cudaFreeHost(block) != cudaSuccess) cudaGetLastError();
}

}  // namespace

PinnedBlocks::~PinnedBlocks() {
  for (void* block : free_) free_block(block);
}

void* PinnedBlocks::take() {
  {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      void* block = free_.back();
      free_.pop_back();
      return block;
    }
  }
  void* block = nullptr;
  if (cudaMallocHost(&block, bytes_) != cudaSuccess) {
    cudaGetLastError();  // (not sticky: ordinary memory does instead)
    return nullptr;
  }
  return block;
}

void PinnedBlocks::give(void* block) {
  std::lock_guard lock(mutex_);
  try {
    free_.push_back(block);
  } catch (const std::bad_alloc&) {  // (give() runs in destructors)
    free_block(block);
  }
}


HostFloats::HostFloats(std::shared_ptr<PinnedBlocks> pool, size_t count) : count_(count) {
  if (pool && pool->bytes() >= count * sizeof(float)) pinned_ = static_cast<float*>(pool->take());
  if (pinned_) pool_ = std::move(pool);
  else plain_.resize(count);
}

HostFloats::~HostFloats() { release(); }

void HostFloats::release() {
  if (pinned_) pool_->give(pinned_);
  pinned_ = nullptr;
  pool_.reset();
  plain_.clear();
  count_ = 0;
}

HostFloats::HostFloats(HostFloats&& other) noexcept
    : pool_(std::move(other.pool_)), pinned_(std::exchange(other.pinned_, nullptr)), plain_(std::move(other.plain_)),
      count_(std::exchange(other.count_, 0)) {}

HostFloats& HostFloats::operator=(HostFloats&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::move(other.pool_);
    pinned_ = std::exchange(other.pinned_, nullptr);
    plain_ = std::move(other.plain_);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

}  // namespace lode::cuda
