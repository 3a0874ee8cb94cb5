#include "cuda/roofline.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "cuda/vram.h"

namespace lode::cuda {

double measure_copy_gbps(VramAccountant& vram, size_t bytes, int repeats) {
  DeviceBuffer from(vram, bytes, VramUse::scratch, "bandwidth probe (source)");
  DeviceBuffer to(vram, bytes, VramUse::scratch, "bandwidth probe (target)");
  cudaMemset(from.data(), 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int i = 0; i <= repeats; ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(to.data(), from.data(), bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    if (i > 0) ms.push_back(t);  // the first is the warm-up
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess)
    fail("CUDA: measuring the copy bandwidth: {}", cudaGetErrorString(err));
  std::sort(ms.begin(), ms.end());
  return 2.0 * double(bytes) / (double(ms[ms.size() / 2]) * 1e-3) / 1e9;
}

}  // namespace lode::cuda
