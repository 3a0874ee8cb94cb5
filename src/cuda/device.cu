#include "cuda/device.h"

#include <cuda_runtime.h>

namespace lode::cuda {

std::vector<DeviceInfo> list_devices(std::string* why) {
  std::vector<DeviceInfo> devices;
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    if (why) *why = std::string("CUDA runtime: ") + cudaGetErrorString(err);
    return devices;
  }
  if (count == 0 && why) *why = "CUDA runtime sees no device";
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
  return devices;
}

std::string first_device_name() {
  int count = 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDeviceProperties(&prop, 0) != cudaSuccess)
    return {};
  return prop.name;
}

}  // namespace lode::cuda
