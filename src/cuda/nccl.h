// NCCL, NVIDIA's collective communication library (CUDA 13's libnccl.so.2), for the GPUs of one
// process (cuda/pipeline.h). It is loaded at run time (dlopen) the first time it is asked for: it
// is about 200 MB, one GPU never needs it, and a machine without it still runs lode on one GPU or
// hands rows between GPUs by peer copies. Its types come from the toolkit's nccl.h at build time.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace lode::cuda {

class NcclGroup {
 public:
  // One communicator for each GPU of `devices` (distinct CUDA device indices; ranks in that order).
  // Fails (lode::Error) saying what to do when libnccl.so.2 cannot be loaded, for a GPU named
  // twice (NCCL takes one rank a GPU), or with NCCL's own reason.
  explicit NcclGroup(const std::vector<int>& devices);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  // Pairs of copies of `bytes` each from rank a's buffers to rank b's, the sends queued on a's
  // stream and the receives on b's (cudaStream_t), in one group call from this thread.
  struct Copy {
    const void* from;
    void* to;
  };
  void copy(int a, void* a_stream, int b, void* b_stream, const std::vector<Copy>& copies, size_t bytes);
  std::string version() const;  // "2.27.7"

 private:
  void connect_neighbours(const std::vector<int>& devices);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lode::cuda
