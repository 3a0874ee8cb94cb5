#include "cuda/miss_server.h"

#include <algorithm>
#include <bit>

#include "cpu/spin_pool.h"

namespace lode::cuda {

namespace {

using Clock = std::chrono::steady_clock;

// The server spins while requests come (a decode step sends one per layer); after this long
// without one it naps between looks, costing a nap's length on the next step's first request.
constexpr auto kSpinBeforeNapping = std::chrono::milliseconds(50);
constexpr auto kNap = std::chrono::microseconds(50);

}  // namespace

MissServer::MissServer(const model::ModelWeights& weights, cpu::HostExperts& host, kernels::MissMailbox& box,
                       const float* x, float* y)
    : bytes_(plan::expert_bytes(weights)), host_(host), box_(box), x_(x), y_(y), thread_([this] { serve(); }) {}

MissServer::~MissServer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

bool MissServer::caught_up(std::chrono::nanoseconds timeout) const {
  std::atomic_ref<uint32_t> request(box_.request), done(box_.done);
  const auto until = Clock::now() + timeout;
  while (done.load(std::memory_order_acquire) != request.load(std::memory_order_acquire)) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(kNap);
  }
  return true;
}

MissServerCounts MissServer::counts() const {
  return {.requests = requests_.load(),
          .experts = experts_.load(),
          .pairs = pairs_.load(),
          .hinted_experts = hinted_experts_.load(),
          .expert_bytes = expert_bytes_.load(),
          .pair_bytes = pair_bytes_.load(),
          .token_pair_bytes = token_pair_bytes_.load(),
          .read_ahead_bytes = read_ahead_bytes_.load(),
          .cpu_seconds = double(cpu_ns_.load()) * 1e-9};
}

// Answers each request; between them reads ahead the experts a hint names, until the request
// comes.
void MissServer::serve() {
  std::atomic_ref<uint32_t> request(box_.request), hint(box_.hint);
  uint32_t seen = 0, seen_hint = 0;
  int32_t experts[kernels::kMaxMissExperts];
  auto idle_since = Clock::now();
  for (int spins = 0; !stop_.load(std::memory_order_relaxed); ++spins) {
    const uint32_t number = request.load(std::memory_order_acquire);
    if (number != seen) {
      seen = number;
      answer(number, experts);
      idle_since = Clock::now();
      continue;
    }
    const uint32_t hint_number = hint.load(std::memory_order_acquire);
    if (hint_number != seen_hint) {
      seen_hint = hint_number;
      read_ahead(experts, [&] { return request.load(std::memory_order_relaxed) != seen; });
      idle_since = Clock::now();
      continue;
    }
    cpu::spin_pause();
    if (spins % 1024 == 1023 && Clock::now() - idle_since > kSpinBeforeNapping) std::this_thread::sleep_for(kNap);
  }
}

void MissServer::answer(uint32_t number, int32_t* experts) {
  const int64_t layer = std::atomic_ref<int32_t>(box_.layer).load(std::memory_order_acquire);
  const int n = std::clamp(std::atomic_ref<int32_t>(box_.count).load(std::memory_order_acquire), 0,
                           int32_t(kernels::kMaxMissExperts));
  const int hinted = std::clamp(std::atomic_ref<int32_t>(box_.hinted).load(std::memory_order_acquire), 0, n);
  const bool grouped = std::atomic_ref<int32_t>(box_.grouped).load(std::memory_order_acquire) != 0;
  uint64_t rows[kernels::kMaxMissExperts];
  std::copy_n(box_.expert, n, experts);
  std::copy_n(box_.rows, n, rows);
  int64_t pairs = 0;
  for (int i = 0; i < n; ++i) pairs += std::popcount(rows[i]);
  // A request read while the device rewrote it (only after a step stopped waiting for an answer:
  // the run is failing already) is left unanswered rather than computed: HostExperts would refuse
  // it by throwing on this thread, which ends the process instead of that step's clear error.
  if (layer < 0 || layer >= int64_t(bytes_.size()) || pairs > kernels::kMaxMissPairs) return;
  answered_layer_ = layer;
  const auto start = Clock::now();
  host_.compute(layer, experts, rows, n, x_, y_);
  cpu_ns_ += uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
  // Counted before the answer is posted, so that the counts are whole once the device has it.
  requests_ += 1, experts_ += uint64_t(n), pairs_ += uint64_t(pairs), hinted_experts_ += uint64_t(hinted);
  expert_bytes_ += uint64_t(n) * bytes_[size_t(layer)].total();
  pair_bytes_ += uint64_t(pairs) * bytes_[size_t(layer)].total();
  if (!grouped) token_pair_bytes_ += uint64_t(pairs) * bytes_[size_t(layer)].total();
  std::atomic_ref<uint32_t>(box_.done).store(number, std::memory_order_release);
}

template <class Stop>
void MissServer::read_ahead(int32_t* experts, Stop&& stop) {
  const int64_t layer = std::atomic_ref<int32_t>(box_.hint_layer).load(std::memory_order_acquire);
  const int n = std::clamp(std::atomic_ref<int32_t>(box_.hint_count).load(std::memory_order_acquire), 0,
                           int32_t(kernels::kMaxMissExperts));
  // A hint for the layer just answered came too late to help (the host was behind).
  if (layer < 0 || layer >= int64_t(bytes_.size()) || layer == answered_layer_) return;
  std::copy_n(box_.hint_expert, n, experts);
  read_ahead_bytes_ += uint64_t(host_.prefetch(layer, experts, n, stop));
}

}  // namespace lode::cuda
