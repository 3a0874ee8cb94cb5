#include "cuda/errors.h"

#include "core/error.h"

namespace lode::cuda {

void check_cuda(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // a non-sticky error would otherwise surface again at the next check
  fail("CUDA: {}: {}", what, cudaGetErrorString(err));
}

void check(const char* launch_error, std::string_view what) {
  if (!launch_error) return;
  cudaGetLastError();
  fail("CUDA: {}: {}", what, launch_error);
}

}  // namespace lode::cuda
