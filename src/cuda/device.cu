#include "cuda/device.h"

#include <cuda_runtime.h>

namespace lode::cuda {

namespace {

// Compiled like every other kernel: if the runtime finds no code for the device here, it finds
// none for the others either.
__global__ void probe_kernel() {}

}  // namespace

std::vector<DeviceInfo> list_devices(std::string* why) {
  std::vector<DeviceInfo> devices;
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    if (why) *why = std::string("CUDA runtime: ") + cudaGetErrorString(err);
    return devices;
  }
  if (count == 0 && why) *why = "CUDA runtime sees no device";
  int current = 0;  // (made current again afterwards: asking for free memory selects each device)
  cudaGetDevice(&current);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.cc_major = prop.major;
    d.cc_minor = prop.minor;
    d.total_bytes = prop.totalGlobalMem;
    if (cudaSetDevice(i) == cudaSuccess) cudaMemGetInfo(&d.free_bytes, &d.total_bytes);
    devices.push_back(d);
  }
  if (count > 0) cudaSetDevice(current);
  return devices;
}

int count_devices() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::string first_device_name() {
  int count = 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDeviceProperties(&prop, 0) != cudaSuccess)
    return {};
  return prop.name;
}

std::string kernels_missing_for(int device) {
  cudaFuncAttributes attributes{};
  const cudaError_t err = cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(probe_kernel));
  if (err == cudaSuccess) return {};
  cudaGetLastError();  // not sticky: clear it
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);
  return std::string("this lode's CUDA code cannot run on ") + prop.name + " (compute capability " +
         std::to_string(prop.major) + "." + std::to_string(prop.minor) + "; CUDA runtime: " + cudaGetErrorString(err) +
         "): rebuild with LODE_CUDA_ALL_ARCHS=ON (sm_80/86/89/90a/120), or run on the CPU engine (--backend cpu)";
}

}  // namespace lode::cuda
