// A pool of threads that spin while they wait, for work measured in microseconds: the CPU miss
// path runs a short parallel loop per MoE layer inside a decode step, where waking sleeping threads
// (tens of microseconds) would cost more than the work. Threads that find nothing to do for a
// while fall asleep (std::atomic wait) and cost nothing between generations. A run waits only for
// its tasks, never for a thread that has not joined in: on a virtual machine a thread's core can be
// taken away for milliseconds, and a pool that waited for every thread would stall with it.
#pragma once
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace lode::cpu {

// One beat of a spin-wait: tells the core this thread is waiting (x86's pause; nothing elsewhere).
inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

class SpinPool {
 public:
  // `threads` in all, the caller of run() included (at least 1).
  explicit SpinPool(int threads);
  ~SpinPool();
  SpinPool(const SpinPool&) = delete;
  SpinPool& operator=(const SpinPool&) = delete;

  // Calls task(i) for every i in [0, tasks), spread over the pool and the calling thread; returns
  // when every call has returned. One run at a time (from one thread); no allocation.
  template <class F>
  void run(int64_t tasks, F&& task) {
    run_job(tasks, [](void* f, int64_t i) { (*static_cast<F*>(f))(i); }, &task);
  }
  int threads() const { return int(workers_.size()) + 1; }

 private:
  using Call = void (*)(void*, int64_t);
  void run_job(int64_t tasks, Call call, void* context);
  void work(uint32_t generation);
  void worker_loop();

  // Generation g's job, in slot g % 2. A thread claims task i by moving `claim_` from
  // (generation, i) to (generation, i + 1), having checked i against the slot's count. The slot is
  // written before g is published (claim_) and not again until g + 2 is prepared, after g's tasks
  // have all returned and g + 1 has been published; so a claim that succeeds runs g's job, and a
  // thread late from an older generation fails its claim. (With one job for every generation, a
  // thread holding the last claim word of a finished generation could read the next job's count
  // and function while the caller was between writing them and publishing it, and claim a task
  // that the next generation then gave out again: a stress of 3 million runs with 32 threads on 2
  // cores ran 16 tasks twice, none since. In the CPU miss path a gate|up task run twice counts
  // down its expert twice, and the down product starts on unfinished sums.)
  struct Job {
    std::atomic<Call> call{nullptr};
    std::atomic<void*> context{nullptr};
    std::atomic<int64_t> tasks{0};
  };
  Job jobs_[2];
  std::atomic<uint64_t> claim_{0};   // generation << 32 | the next task
  std::atomic<int64_t> done_{0};
  std::atomic<uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;
};

}  // namespace lode::cpu
