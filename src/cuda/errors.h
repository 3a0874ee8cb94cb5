// How the CUDA backend's host code turns runtime failures into lode::Error: the message names what
// was being done and the runtime's reason, and the runtime's last-error state is cleared first, so
// a failed call (say, a copy) is not reported again by the next kernel launch's check.
#pragma once
#include <cuda_runtime.h>

#include <string_view>

namespace lode::cuda {

// Fails when err is not cudaSuccess.
void check_cuda(cudaError_t err, std::string_view what);
// Fails saying there is no usable GPU (why: the runtime's reason or the device count) and that
// the CPU engine runs without one.
[[noreturn]] void fail_no_gpu(std::string_view why);
// Fails when a kernel launcher (cuda/forward_kernels.h and the like) returned a message.
void check(const char* launch_error, std::string_view what);

}  // namespace lode::cuda
