// The GPUs the CUDA runtime can see. Only compiled when lode is built with CUDA (LODE_HAVE_CUDA).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace lode::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  size_t total_bytes = 0, free_bytes = 0;
};

// Every visible device; empty when there is none, with the runtime's reason in *why. (Asking
// each device for its free memory creates a context on it; the current device stays current.)
std::vector<DeviceInfo> list_devices(std::string* why);
// How many devices the CUDA runtime sees (0 without a driver); creates no context.
int count_devices();
// The first visible device's name, or empty when there is none; creates no context.
std::string first_device_name();
// Empty when this build's kernels can run on `device`; else what is wrong and what to do (the
// build carries code for sm_90a only unless configured with LODE_CUDA_ALL_ARCHS).
std::string kernels_missing_for(int device);

}  // namespace lode::cuda
