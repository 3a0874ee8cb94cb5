#include "cuda/kernel_clock.h"

#include "cuda/errors.h"

namespace lode::cuda {

namespace {

// Holds the stream about `ns` nanoseconds (at most ~0.1 s whatever the timer says), so that the
// host has queued the step's kernels before the GPU reaches them: time the GPU would otherwise
// spend waiting for the next launch is not booked to that kernel.
__global__ void hold_kernel(unsigned long long ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (int i = 0; i < 100000; ++i) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns) break;
    __nanosleep(1000);
  }
}

constexpr unsigned long long kHoldNs = 5'000'000;  // a 35B step queues in ~2 ms

}  // namespace

KernelClock::~KernelClock() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

cudaEvent_t KernelClock::event(size_t i) {
  while (events_.size() <= i) {
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreate(&e), "a profile event");
    events_.push_back(e);
  }
  return events_[i];
}

void KernelClock::begin(cudaStream_t stream) {
  used_ = 0;
  pending_.clear();
  hold_kernel<<<1, 1, 0, stream>>>(kHoldNs);
  check_cuda(cudaGetLastError(), "holding a profiled step");
  check_cuda(cudaEventRecord(event(used_++), stream), "a profile event");
}

void KernelClock::after(std::string_view name, std::string_view launch, double bytes, cudaStream_t stream) {
  if (used_ == 0) return;  // not inside a timed step
  auto at = index_.find(name);
  if (at == index_.end()) {
    at = index_.emplace(std::string(name), classes_.size()).first;
    KernelClassTime added;
    added.name = std::string(name);
    added.launch = std::string(launch);
    classes_.push_back(added);
  }
  KernelClassTime& c = classes_[at->second];
  ++c.launches, c.bytes += bytes;
  pending_.push_back(at->second);
  check_cuda(cudaEventRecord(event(used_++), stream), "a profile event");
}

void KernelClock::settle() {
  if (used_ == 0) return;
  check_cuda(cudaEventSynchronize(events_[used_ - 1]), "a profiled step");
  for (size_t i = 0; i < pending_.size(); ++i) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]), "a profile interval");
    classes_[pending_[i]].seconds += 1e-3 * double(ms);
  }
  used_ = 0;
  pending_.clear();
}

}  // namespace lode::cuda
