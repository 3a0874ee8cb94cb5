#include "cuda/miss_path.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "cuda/errors.h"
#include "cuda/roofline.h"
#include "plan/memory_plan.h"
#include "plan/scratch.h"

namespace lode::cuda {

namespace {

using Clock = std::chrono::steady_clock;

// The device words' layout inside the decode scratch's kMissPathScratch bytes.
constexpr size_t kSequenceAt = 0, kHintSequenceAt = 4, kPendingAt = 16,
                 kSharesAt = kPendingAt + 4 * (1 + kernels::kMaxMissPairs),
                 kHintedAt = kSharesAt + 4 * (1 + kernels::kMaxMissShares),
                 kProbeSinkAt = kHintedAt + 2 * 4 * (1 + kernels::kMaxMissExperts), kClockAt = kProbeSinkAt + 8;
static_assert(kClockAt + 3 * 8 <= plan::kMissPathScratch && kClockAt % 8 == 0);

int server_threads() {
  // All cores but two: one drives the GPU (its launches and its waits), one is left to the system, so
  // that a pool thread the scheduler takes away (the pool waits for all of them) is rare.
  const unsigned cores = std::thread::hardware_concurrency();
  return cores > 2 ? int(cores) - 2 : 1;
}

size_t aligned(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

MissPath::MissPath(const model::ModelWeights& weights, plan::MissPath path, void* device_words, void* stream)
    : weights_(weights), host_(weights, server_threads(), kernels::kMaxMissPairs, kernels::kMaxMissRows) {
  const model::Qwen35MoeConfig& c = weights.config;
  if (c.n_experts_used > kernels::kMaxMissTokenExperts)
    fail("the CPU miss path routes at most {} experts per token; this model routes {} (use --miss-path gpu)",
         kernels::kMaxMissTokenExperts, c.n_experts_used);
  const size_t x_at = aligned(sizeof(kernels::MissMailbox));
  const size_t y_at = x_at + aligned(size_t(kernels::kMaxMissRows * c.hidden) * 4);
  const size_t bytes = y_at + size_t(kernels::kMaxMissPairs * c.hidden) * 4;
  void* mailbox = nullptr;
  check_cuda(cudaHostAlloc(&mailbox, bytes, cudaHostAllocMapped), "the CPU miss path's mailbox (pinned memory)");
  std::memset(mailbox, 0, bytes);
  box_ = new (mailbox) kernels::MissMailbox();
  x_ = reinterpret_cast<float*>(static_cast<uint8_t*>(mailbox) + x_at);
  y_ = reinterpret_cast<float*>(static_cast<uint8_t*>(mailbox) + y_at);
  check_cuda(cudaMallocHost(&pinned_shares_, size_t(1 + kernels::kMaxMissShares) * 4), "pinned memory");
  void* device_box = nullptr;
  check_cuda(cudaHostGetDevicePointer(&device_box, mailbox, 0), "mapping the CPU miss path's mailbox");
  auto* words = static_cast<uint8_t*>(device_words);
  link_.box = static_cast<kernels::MissMailbox*>(device_box);
  link_.x = reinterpret_cast<float*>(static_cast<uint8_t*>(device_box) + x_at);
  link_.y = reinterpret_cast<const float*>(static_cast<uint8_t*>(device_box) + y_at);
  link_.sequence = reinterpret_cast<uint32_t*>(words + kSequenceAt);
  link_.pending = reinterpret_cast<int32_t*>(words + kPendingAt);
  link_.share = reinterpret_cast<const int32_t*>(words + kSharesAt);
  link_.hint_sequence = reinterpret_cast<uint32_t*>(words + kHintSequenceAt);
  link_.hinted = reinterpret_cast<int32_t*>(words + kHintedAt);
  link_.clock = reinterpret_cast<uint64_t*>(words + kClockAt);
  link_.hidden = int(c.hidden);
  link_.cpu_takes_all = path == plan::MissPath::cpu;
  measure_costs();
  probe_gbps_ = measure_mapped_read_gbps(reinterpret_cast<unsigned*>(words + kProbeSinkAt), size_t(64) << 20, 3);
  size_t all_bytes = 0;
  for (const plan::ExpertBytes& b : plan::expert_bytes(weights)) all_bytes += b.total();
  costs_.gpu_expert_us = double(all_bytes) / double(weights.layers.size()) / (probe_gbps_ * 1e3);
  split_ = std::make_unique<plan::MissSplit>(path, int(c.n_experts_used), costs_, kernels::kMaxMissShares);
  upload_shares(stream);
  check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "the CPU miss path's split");
  server_ = std::make_unique<MissServer>(weights, host_, *box_, x_, y_);
}

MissPath::~MissPath() {
  server_.reset();
  cudaFreeHost(pinned_shares_);
  cudaFreeHost(box_);
}

// The CPU's cost on the model's own experts: one and k experts at a time, each try on experts not
// touched before (as a step's misses are not in the caches), the best of seven (a pool thread the
// scheduler takes away for a time slice makes a try milliseconds slower: seen on the H200 host).
void MissPath::measure_costs() {
  const model::Qwen35MoeConfig& c = weights_.config;
  const int k = int(c.n_experts_used);
  const std::vector<float> x(static_cast<size_t>(c.hidden), 0.01f);
  std::vector<int32_t> experts(static_cast<size_t>(k));
  int64_t next = 0, layer = 0;
  const auto take_new = [&](int n) {  // n experts not touched before, in one layer
    layer = next / c.n_experts % c.n_layers;
    for (int i = 0; i < n; ++i) experts[size_t(i)] = int32_t(next++ % c.n_experts);
  };
  const auto us = [](auto&& work) {
    const auto start = Clock::now();
    work();
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  };
  const auto compute = [&](int n) { host_.compute(layer, experts.data(), n, x.data(), y_); };
  const auto cold_us = [&](int n) { return take_new(n), us([&] { compute(n); }); };
  cold_us(k), cold_us(k);  // wakes the pool
  double t1 = 1e30, tk = 1e30, cached = 1e30, read_ahead = 1e30, after_read_ahead = 1e30;
  for (int i = 0; i < 7; ++i) {
    t1 = std::min(t1, cold_us(1)), tk = std::min(tk, cold_us(k));
    // The same k again, their bytes in the caches now: how much a hint can save at most.
    cached = std::min(cached, us([&] { compute(k); }));
    // k new experts read ahead, as a hint has the host do, then computed.
    take_new(k);
    read_ahead = std::min(read_ahead, us([&] { host_.prefetch(layer, experts.data(), k, [] { return false; }); }));
    after_read_ahead = std::min(after_read_ahead, us([&] { compute(k); }));
  }
  cached_us_ = cached, read_ahead_us_ = read_ahead, after_read_ahead_us_ = after_read_ahead;
  costs_.cpu_expert_us = k > 1 ? std::max(tk - t1, 0.0) / (k - 1) : t1;
  costs_.cpu_request_us = std::max(t1 - costs_.cpu_expert_us, 0.0);
}

void MissPath::upload_shares(void* stream) {
  const std::vector<int32_t>& shares = split_->shares();
  std::copy(shares.begin(), shares.end(), pinned_shares_);
  check_cuda(cudaMemcpyAsync(const_cast<int32_t*>(link_.share), pinned_shares_, shares.size() * 4,
                             cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)),
             "the CPU miss path's split");
}

void MissPath::after_step(double step_seconds, void* stream) {
  std::atomic_ref<uint32_t> timed_out(box_->timed_out);
  if (timed_out.load(std::memory_order_acquire)) {
    const int32_t layer = box_->layer;
    // The step went on without the answer, so its outputs are wrong and it fails; the next step
    // may use the mailbox again once the host has answered this step's last request.
    if (server_->caught_up(std::chrono::nanoseconds(kTimeoutNs))) timed_out.store(0, std::memory_order_release);
    fail("the CPU miss path did not answer layer {}'s request within {} s (a stalled host?); run with "
         "--miss-path gpu to read absent experts over PCIe only",
         layer, kTimeoutNs / 1'000'000'000);
  }
  if (step_seconds >= 0 && split_->observe_step(step_seconds)) upload_shares(stream);
}

MissStats MissPath::stats() const {
  uint64_t clock[3] = {};
  check_cuda(cudaMemcpy(clock, link_.clock, sizeof(clock), cudaMemcpyDeviceToHost), "the CPU miss path's clocks");
  const MissServerCounts c = server_->counts();
  return {.gpu_share_seconds = double(clock[1]) * 1e-9,
          .host_wait_seconds = double(clock[2]) * 1e-9,
          .requests = c.requests,
          .experts = c.experts,
          .hinted_experts = c.hinted_experts,
          .expert_bytes = c.expert_bytes,
          .token_pair_bytes = c.token_pair_bytes,
          .read_ahead_bytes = c.read_ahead_bytes,
          .cpu_seconds = c.cpu_seconds};
}

std::string MissPath::describe() const {
  std::string shares;
  const size_t k = size_t(weights_.config.n_experts_used);  // (a token's; steps of several rows read further)
  for (size_t m = 0; m <= k; ++m) shares += fmt::format("{}{}", m ? " " : "", split_->shares()[m]);
  return fmt::format("CPU miss path: {} threads; a request {:.0f} us + {:.0f} us per expert on the CPU ({} again {:.0f} "
                     "us; read ahead in {:.0f} us, then {:.0f} us), {:.0f} us per expert over PCIe ({:.1f} GB/s mapped "
                     "reads); of 0..{} absent experts the CPU takes {}",
                     host_.threads(), costs_.cpu_request_us, costs_.cpu_expert_us, k, cached_us_, read_ahead_us_,
                     after_read_ahead_us_, costs_.gpu_expert_us, probe_gbps_, k, shares);
}

}  // namespace lode::cuda
