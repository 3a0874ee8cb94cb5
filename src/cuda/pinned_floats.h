// Host floats that the device copies to and from at the link's speed: page-locked blocks of one
// size, kept for reuse. The DeltaNet states of prefix checkpoints (CudaSession::Prefix, 63 MiB for
// the 35B) are taken and restored for every server request that shares a prefix; from pageable
// memory each copy goes through the driver's staging at a fraction of the link. A block given back
// is kept for the next checkpoint, not freed: cudaFreeHost waits for the device and cudaMallocHost
// takes milliseconds, and a server takes and drops checkpoints all the time. So the blocks a pool
// holds are the most that were ever in use at once (for prefixes, what the server's bound on their
// memory allows), until the pool goes.
#pragma once
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace lode::cuda {

class PinnedBlocks {
 public:
  explicit PinnedBlocks(size_t bytes) : bytes_(bytes) {}
  ~PinnedBlocks();
  PinnedBlocks(const PinnedBlocks&) = delete;
  PinnedBlocks& operator=(const PinnedBlocks&) = delete;

  size_t bytes() const { return bytes_; }
  void* take();            // a block, or nullptr where no page-locked memory could be had
  void give(void* block);  // back, for the next take()

 private:
  size_t bytes_;
  std::mutex mutex_;
  std::vector<void*> free_;
};

// `count` floats, in a block of `pool` when it holds that many and gives one, else in ordinary
// memory. Move-only; gives its block back when destroyed.
class HostFloats {
 public:
  HostFloats() = default;
  HostFloats(std::shared_ptr<PinnedBlocks> pool, size_t count);
  ~HostFloats();
  HostFloats(HostFloats&& other) noexcept;
  HostFloats& operator=(HostFloats&& other) noexcept;
  HostFloats(const HostFloats&) = delete;
  HostFloats& operator=(const HostFloats&) = delete;

  float* data() { return pinned_ ? pinned_ : plain_.data(); }
  const float* data() const { return pinned_ ? pinned_ : plain_.data(); }
  size_t size() const { return count_; }
  bool pinned() const { return pinned_ != nullptr; }

 private:
  void release();

  std::shared_ptr<PinnedBlocks> pool_;
  float* pinned_ = nullptr;
  std::vector<float> plain_;
  size_t count_ = 0;
};

}  // namespace lode::cuda
