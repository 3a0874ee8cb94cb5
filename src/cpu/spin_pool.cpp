#include "cpu/spin_pool.h"

#include <chrono>

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

void SpinPool::work(uint32_t generation) {
  const Job& job = jobs_[generation % 2];
  for (;;) {
    uint64_t claim = claim_.load(std::memory_order_acquire);
    if (uint32_t(claim >> 32) != generation) return;
    const int64_t i = int64_t(claim & 0xffffffffu);
    // (Acquire: a count written for generation + 2 comes after generation + 1's publication, and
    // then the claim below fails.)
    if (i >= job.tasks.load(std::memory_order_acquire)) return;
    if (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel)) continue;
    // Claimed: the generation's run waits for this task, so the slot still holds its job.
    job.call.load(std::memory_order_relaxed)(job.context.load(std::memory_order_relaxed), i);
    done_.fetch_add(1, std::memory_order_release);
  }
}

void SpinPool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    auto idle_since = std::chrono::steady_clock::now();
    for (int spins = 0; generation_.load(std::memory_order_acquire) == seen; ++spins) {
      spin_pause();
      if (spins % 1024 == 1023 && std::chrono::steady_clock::now() - idle_since > kSpinBeforeSleep) {
        generation_.wait(seen, std::memory_order_acquire);
        idle_since = std::chrono::steady_clock::now();
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    work(seen);
  }
}

void SpinPool::run_job(int64_t tasks, Call call, void* context) {
  const uint32_t generation = generation_.load(std::memory_order_relaxed) + 1;
  Job& job = jobs_[generation % 2];
  job.call.store(call, std::memory_order_relaxed);
  job.context.store(context, std::memory_order_relaxed);
  job.tasks.store(tasks, std::memory_order_release);
  done_.store(0, std::memory_order_relaxed);
  claim_.store(uint64_t(generation) << 32, std::memory_order_release);
  generation_.store(generation, std::memory_order_release);
  generation_.notify_all();
  work(generation);
  while (done_.load(std::memory_order_acquire) < tasks) spin_pause();
}

}  // namespace lode::cpu
