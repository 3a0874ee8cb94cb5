#include "cuda/probe_kernels.h"

#include <cuda_runtime.h>

namespace lode::cuda {

namespace {

// Each thread sums its share of 16-byte words; the sum is stored only if it is a value no input
// gives, so the loads cannot be dropped and nothing is written.
__global__ void read_in_place_kernel(const uint4* data, size_t words, unsigned* sink) {
  unsigned sum = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(data + i);
    sum += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (sum == 0x9E3779B9u) *sink = sum;
}

}  // namespace

const char* read_in_place(const void* data, size_t bytes, unsigned* sink) {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  read_in_place_kernel<<<sms * 8, 256>>>(static_cast<const uint4*>(data), bytes / 16, sink);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace lode::cuda
