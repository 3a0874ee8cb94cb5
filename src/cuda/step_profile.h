// How `lode bench --profile` times a decode step (cuda/session.h): by phase, waiting for the GPU
// at each phase boundary (cuda/phase_clock.h), or kernel by kernel, an event after each kernel and
// no wait inside the step (cuda/kernel_clock.h). No CUDA types here.
#pragma once
#include <cstdint>
#include <string>

namespace lode::cuda {

enum class StepProfile { phases, kernels };

// One kernel class's share of the steps timed kernel by kernel.
struct KernelClassTime {
  std::string name;    // e.g. "experts gate|up (q4_k)"
  std::string launch;  // its launches' own name, without the weights' type: what CudaSession::leave_out takes
  int64_t launches = 0;
  double seconds = 0;
  double bytes = 0;  // what its kernels must move: weights read, recurrent state read and written, K/V read
};

}  // namespace lode::cuda
