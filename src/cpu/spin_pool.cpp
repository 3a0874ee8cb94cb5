#include "cpu/spin_pool.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LODE_PAUSE() _mm_pause()
#else
#define LODE_PAUSE() ((void)0)
#endif

namespace lode::cpu {

namespace {
// How long an idle worker spins before it sleeps: longer than the gaps inside a decode step and
// between steps (a few milliseconds), shorter than a pause a person would notice in top.
constexpr auto kSpinBeforeSleep = std::chrono::milliseconds(50);
}  // namespace

SpinPool::SpinPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

SpinPool::~SpinPool() {
  stop_.store(true);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void SpinPool::work() {
  for (int64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < tasks_;) {
    call_(context_, i);
    done_.fetch_add(1, std::memory_order_release);
  }
}

void SpinPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    auto idle_since = std::chrono::steady_clock::now();
    for (int spins = 0; generation_.load(std::memory_order_acquire) == seen; ++spins) {
      LODE_PAUSE();
      if (spins % 1024 == 1023 && std::chrono::steady_clock::now() - idle_since > kSpinBeforeSleep) {
        generation_.wait(seen, std::memory_order_acquire);
        idle_since = std::chrono::steady_clock::now();
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    work();
    finished_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void SpinPool::run_job(int64_t tasks, Call call, void* context) {
  call_ = call, context_ = context, tasks_ = tasks;
  next_.store(0, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  finished_.store(0, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  work();
  // Every task done, and every worker out of work() (each takes part in every generation), so the
  // next run may reset the counters and the job.
  while (done_.load(std::memory_order_acquire) < tasks ||
         finished_.load(std::memory_order_acquire) < int(workers_.size()))
    LODE_PAUSE();
}

}  // namespace lode::cpu
