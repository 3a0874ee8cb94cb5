#include "cuda/roofline.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "cuda/probe_kernels.h"
#include "cuda/vram.h"

namespace lode::cuda {

double median_event_ms(const std::function<void()>& work, int warmups, int repeats) {
  for (int i = 0; i < warmups; ++i) work();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int i = 0; i < repeats; ++i) {
    cudaEventRecord(start);
    work();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) fail("CUDA: timing: {}", cudaGetErrorString(err));
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]);
}

double measure_copy_gbps(VramAccountant& vram, size_t bytes, int repeats) {
  DeviceBuffer from(vram, bytes, VramUse::scratch, "bandwidth probe (source)");
  DeviceBuffer to(vram, bytes, VramUse::scratch, "bandwidth probe (target)");
  cudaMemset(from.data(), 1, bytes);
  const double ms =
      median_event_ms([&] { cudaMemcpyAsync(to.data(), from.data(), bytes, cudaMemcpyDeviceToDevice); }, 1, repeats);
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

namespace {

// Pinned host memory, mapped for the device, freed when it goes out of scope.
struct PinnedHost {
  explicit PinnedHost(size_t bytes) {
    if (cudaHostAlloc(&data, bytes, cudaHostAllocMapped) != cudaSuccess)
      fail("CUDA: {:.0f} MiB of pinned host memory for the PCIe probe", double(bytes) / double(1 << 20));
    std::memset(data, 1, bytes);
  }
  ~PinnedHost() { cudaFreeHost(data); }
  void* data = nullptr;
};

}  // namespace

double measure_host_to_device_gbps(VramAccountant& vram, size_t bytes, int repeats) {
  PinnedHost host(bytes);
  DeviceBuffer to(vram, bytes, VramUse::scratch, "PCIe probe");
  const double ms =
      median_event_ms([&] { cudaMemcpyAsync(to.data(), host.data, bytes, cudaMemcpyHostToDevice); }, 1, repeats);
  return double(bytes) / (ms * 1e-3) / 1e9;
}

double measure_mapped_read_gbps(VramAccountant& vram, size_t bytes, int repeats) {
  DeviceBuffer sink(vram, sizeof(unsigned), VramUse::scratch, "mapped-read probe");
  return measure_mapped_read_gbps(sink.as<unsigned>(), bytes, repeats);
}

double measure_mapped_read_gbps(unsigned* sink, size_t bytes, int repeats) {
  PinnedHost host(bytes);
  void* device = nullptr;
  if (cudaHostGetDevicePointer(&device, host.data, 0) != cudaSuccess) fail("CUDA: mapping the PCIe probe");
  const char* err = nullptr;
  const double ms = median_event_ms([&] { err = read_in_place(device, bytes, sink); }, 1, repeats);
  if (err) fail("CUDA: the mapped-read probe: {}", err);
  return double(bytes) / (ms * 1e-3) / 1e9;
}

double measure_matmul_tflops(VramAccountant& vram, MatmulKind kind, int n, int repeats) {
  const bool bf16 = kind == MatmulKind::bf16;
  const size_t element = bf16 ? 2 : 4, bytes = size_t(n) * size_t(n) * element;
  DeviceBuffer a(vram, bytes, VramUse::scratch, "matmul probe (a)");
  DeviceBuffer b(vram, bytes, VramUse::scratch, "matmul probe (b)");
  DeviceBuffer c(vram, size_t(n) * size_t(n) * 4, VramUse::scratch, "matmul probe (c)");
  cudaMemset(a.data(), 0x3c, bytes);  // ~0.0115 in either type: small, finite, not zero
  cudaMemset(b.data(), 0x3c, bytes);
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: creating a handle for the matmul probe");
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType_t in = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute = bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  const double ms = median_event_ms(
      [&] {
        status = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.data(), in, n, b.data(), in, n, &zero,
                              c.data(), CUDA_R_32F, n, compute, CUBLAS_GEMM_DEFAULT);
      },
      1, repeats);
  cublasDestroy(handle);
  if (status != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: the matmul probe: {}", cublasGetStatusString(status));
  return 2.0 * double(n) * double(n) * double(n) / (ms * 1e-3) / 1e12;
}

}  // namespace lode::cuda
