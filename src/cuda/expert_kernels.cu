#include "cuda/expert_kernels.h"

#include <cuda_runtime.h>

namespace lode::cuda::kernels {

namespace {

__global__ void set_experts_kernel(const void** tables, uint8_t* flags, int64_t n_experts, ExpertEntries entries) {
  const int i = threadIdx.x;
  if (i >= entries.count) return;
  const ExpertEntry& e = entries.at[i];
  const int64_t layer = e.index / n_experts, expert = e.index % n_experts;
  const void** table = tables + layer * 3 * n_experts;
  table[expert] = e.gate;
  table[n_experts + expert] = e.up;
  table[2 * n_experts + expert] = e.down;
  flags[e.index] = e.resident;
}

}  // namespace

const char* set_experts(const void** tables, uint8_t* flags, int64_t n_experts, const ExpertEntries& entries,
                        void* stream) {
  if (entries.count <= 0) return nullptr;
  set_experts_kernel<<<1, kMaxExpertEntries, 0, static_cast<cudaStream_t>(stream)>>>(tables, flags, n_experts, entries);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace lode::cuda::kernels
