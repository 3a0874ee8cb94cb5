// Makes a GPU the calling thread's current one for a scope, then the one before it again: every
// call into a session on another GPU than the thread's current one (several GPUs, cuda/pipeline.h;
// a server's worker thread) runs inside one. Host code; needs the CUDA runtime.
#pragma once
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "cuda/errors.h"

namespace lode::cuda {

class OnDevice {
 public:
  explicit OnDevice(int device) {
    check_cuda(cudaGetDevice(&before_), "reading the current device");
    if (device != before_) check_cuda(cudaSetDevice(device), fmt::format("selecting device {}", device));
  }
  ~OnDevice() { cudaSetDevice(before_); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int before_ = 0;
};

}  // namespace lode::cuda
