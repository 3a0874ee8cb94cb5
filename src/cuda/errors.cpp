#include "cuda/errors.h"

#include "core/error.h"

namespace lode::cuda {

void check_cuda(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // a non-sticky error would otherwise surface again at the next check
  fail("CUDA: {}: {}", what, cudaGetErrorString(err));
}

void fail_no_gpu(std::string_view why) {
  fail("no usable NVIDIA GPU (CUDA runtime: {}): the CUDA backend needs one; the CPU engine runs without "
       "(lode run, chat, ppl, logits and serve: --backend cpu)",
       why);
}

void check(const char* launch_error, std::string_view what) {
  if (!launch_error) return;
  cudaGetLastError();
  fail("CUDA: {}: {}", what, launch_error);
}

}  // namespace lode::cuda
