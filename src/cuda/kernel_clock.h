// Where a decode step's GPU time goes kernel by kernel, for `lode bench --profile`: an event
// after every kernel of the step's stream, the kernels queued back to back with no host wait
// inside a step, behind a few milliseconds' hold of the stream so that the host is ahead of the
// GPU (the events' intervals are then the kernels' own times). Each interval is booked to the
// kernel's class ("experts gate|up (q4_K)") with the bytes it must move. Events keep programmatic
// dependent launch from overlapping kernels, so the sum exceeds an unprofiled step; a session only
// keeps this clock when asked to.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/step_profile.h"

namespace lode::cuda {

class KernelClock {
 public:
  KernelClock() = default;
  ~KernelClock();
  KernelClock(const KernelClock&) = delete;
  KernelClock& operator=(const KernelClock&) = delete;

  // The step's first kernel is about to be queued on `stream`.
  void begin(cudaStream_t stream);
  // A kernel of class `name` (a launch named `launch`), moving `bytes` from and to memory, was just
  // queued on `stream`.
  void after(std::string_view name, std::string_view launch, double bytes, cudaStream_t stream);
  // Waits for the stream's step and books its intervals.
  void settle();
  // Totals so far per class, in the order each class was first seen.
  std::vector<KernelClassTime> totals() const { return classes_; }

 private:
  cudaEvent_t event(size_t i);
  std::vector<cudaEvent_t> events_;  // reused step after step
  size_t used_ = 0;                  // events recorded in this step
  std::vector<size_t> pending_;      // per interval of this step: its class
  std::vector<KernelClassTime> classes_;
  std::map<std::string, size_t, std::less<>> index_;
};

}  // namespace lode::cuda
