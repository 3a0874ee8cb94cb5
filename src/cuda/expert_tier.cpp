#include "cuda/expert_tier.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "cuda/errors.h"
#include "cuda/expert_kernels.h"

namespace lode::cuda {

namespace {

const model::ExpertStack& stack(const model::MoeWeights& m, int p) { return p == 0 ? m.gate : p == 1 ? m.up : m.down; }

// A fixed pseudo-random rank of (layer, expert), to break ties without favouring low indices.
uint64_t tie_rank(int64_t layer, int64_t expert) {
  uint64_t x = uint64_t(layer) * 0x9E3779B97F4A7C15ull + uint64_t(expert) + 1;
  x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
  return x;
}

}  // namespace

ExpertTier::ExpertTier(const model::ModelWeights& w, const plan::MemoryPlan& plan, VramAccountant& vram)
    : weights_(w),
      n_layers_(w.config.n_layers),
      n_experts_(w.config.n_experts),
      bytes_(plan.expert_bytes),
      slot_bytes_(plan.slot_bytes),
      slot_of_(size_t(n_layers_ * n_experts_), -1),
      lent_(slot_of_.size(), 0),
      lent_at_(slot_of_.size()),
      resident_count_(plan.experts_resident),
      all_resident_(plan.all_resident()),
      experts_host_(plan.experts_host) {
  if (plan.expert_slots > 0) slots_ = DeviceBuffer(vram, plan.expert_slots, VramUse::experts, "expert slots");
  tables_ = DeviceBuffer(vram, size_t(n_layers_ * 3 * n_experts_) * sizeof(void*), VramUse::weights, "expert tables");
  flags_ = DeviceBuffer(vram, size_t(n_layers_ * n_experts_), VramUse::weights, "expert residency flags");
}

void ExpertTier::load(const std::vector<double>& scores) {
  if (!scores.empty() && scores.size() != slot_of_.size())
    fail("expert placement: {} scores for {} layers of {} experts", scores.size(), n_layers_, n_experts_);
  if (all_resident_) {
    host_tier_ = "none (every expert is in VRAM)";
  } else {
    plan::check_host_ram(experts_host_);
    pin_host_tier();
  }
  place(scores);
  upload_tables();
}

ExpertTier::~ExpertTier() {
  if (copy_stream_) cudaStreamSynchronize(static_cast<cudaStream_t>(copy_stream_));
  for (const Pending& p : pending_) cudaEventDestroy(static_cast<cudaEvent_t>(p.copied));
  for (void* e : spare_events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (evicted_) cudaEventDestroy(static_cast<cudaEvent_t>(evicted_));
  if (counts_copied_) cudaEventDestroy(static_cast<cudaEvent_t>(counts_copied_));
  if (copy_stream_) cudaStreamDestroy(static_cast<cudaStream_t>(copy_stream_));
  if (host_counts_) cudaFreeHost(host_counts_);
  if (pinned_copy_) cudaFreeHost(pinned_copy_);
  else
    for (const HostRange& r : registered_) cudaHostUnregister(const_cast<uint8_t*>(r.begin));
}

// The mapping's expert ranges, page-aligned and merged, registered as mapped read-only memory; where
// the system refuses (no read-only registration, a pinning limit), one pinned copy instead.
void ExpertTier::pin_host_tier() {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (const model::LayerWeights& l : weights_.layers)
    for (int p = 0; p < 3; ++p) {
      const model::ExpertStack& s = stack(l.moe, p);
      const auto begin = reinterpret_cast<uintptr_t>(s.first.data);
      const uintptr_t end = begin + size_t(s.n_experts - 1) * s.expert_stride + size_t(s.first.rows) * s.first.row_bytes;
      ranges.emplace_back(begin / page * page, (end + page - 1) / page * page);
    }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uintptr_t, uintptr_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second) merged.back().second = std::max(merged.back().second, r.second);
    else merged.push_back(r);
  }
  int device = 0, read_only = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, device);
  const unsigned flags = cudaHostRegisterMapped | cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0);
  for (const auto& [begin, end] : merged) {
    auto* p = reinterpret_cast<uint8_t*>(begin);
    if (cudaHostRegister(p, end - begin, flags) != cudaSuccess) {
      cudaGetLastError();
      for (const HostRange& r : registered_) cudaHostUnregister(const_cast<uint8_t*>(r.begin));
      registered_.clear();
      copy_host_tier();
      return;
    }
    void* device = nullptr;
    check_cuda(cudaHostGetDevicePointer(&device, p, 0), "mapping pinned experts");
    registered_.push_back({p, end - begin, static_cast<const uint8_t*>(device)});
  }
  host_tier_ = "registered in place";
}

void ExpertTier::copy_host_tier() {
  size_t total = 0;
  for (const model::LayerWeights& l : weights_.layers)
    for (int p = 0; p < 3; ++p) {
      copy_offset_.push_back(total);
      const model::ExpertStack& s = stack(l.moe, p);
      total += size_t(s.n_experts) * size_t(s.first.rows) * s.first.row_bytes;
    }
  if (const cudaError_t err = cudaHostAlloc(&pinned_copy_, total, cudaHostAllocMapped | cudaHostAllocPortable);
      err != cudaSuccess) {
    cudaGetLastError();
    pinned_copy_ = nullptr;
    fail("host RAM: the experts not in VRAM need {:.1f} GiB of pinned host memory, and neither registering the "
         "model file's pages nor a pinned copy worked ({}); raise --vram-budget so more experts live on the GPU, or "
         "free host memory",
         double(total) / double(1 << 30), cudaGetErrorString(err));
  }
  void* device = nullptr;
  check_cuda(cudaHostGetDevicePointer(&device, pinned_copy_, 0), "mapping pinned experts");
  registered_.push_back({static_cast<const uint8_t*>(pinned_copy_), total, static_cast<const uint8_t*>(device)});
  auto* out = static_cast<uint8_t*>(pinned_copy_);
  for (int64_t l = 0; l < n_layers_; ++l)
    for (int p = 0; p < 3; ++p) {
      const model::ExpertStack& s = stack(weights_.layers[size_t(l)].moe, p);
      const size_t one = size_t(s.first.rows) * s.first.row_bytes;
#pragma omp parallel for schedule(static)
      for (int64_t e = 0; e < s.n_experts; ++e)
        std::memcpy(out + copy_offset_[size_t(3 * l + p)] + size_t(e) * one, s.expert(e).data, one);
    }
  host_tier_ = "a pinned copy";
}

const uint8_t* ExpertTier::host_bytes(int64_t layer, int p, int64_t expert) const {
  const model::ExpertStack& s = stack(weights_.layers[size_t(layer)].moe, p);
  if (!pinned_copy_) return s.expert(expert).data;
  return static_cast<const uint8_t*>(pinned_copy_) + copy_offset_[size_t(3 * layer + p)] +
         size_t(expert) * size_t(s.first.rows) * s.first.row_bytes;
}

const uint8_t* ExpertTier::device_view(const uint8_t* host) const {
  for (const HostRange& r : registered_)
    if (host >= r.begin && host < r.begin + r.bytes) return r.device + (host - r.begin);
  fail("expert tier: an expert outside the pinned host memory");
}

// The plan's share of experts into the slots, the highest scores first, and their bytes copied in.
void ExpertTier::place(const std::vector<double>& scores) {
  std::vector<int64_t> order(slot_of_.size());
  std::iota(order.begin(), order.end(), 0);
  const auto score = [&](int64_t i) { return scores.empty() ? 0.0 : scores[size_t(i)]; };
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (score(a) != score(b)) return score(a) > score(b);
    return tie_rank(a / n_experts_, a % n_experts_) < tie_rank(b / n_experts_, b % n_experts_);
  });
  auto* slots = slots_.as<uint8_t>();
  for (int64_t s = 0; s < resident_count_; ++s) {
    const int64_t i = order[size_t(s)], layer = i / n_experts_, expert = i % n_experts_;
    slot_of_[size_t(i)] = s;
    size_t at = size_t(s) * slot_bytes_;
    for (int p = 0; p < 3; ++p) {
      const size_t n = p == 0 ? bytes_[size_t(layer)].gate : p == 1 ? bytes_[size_t(layer)].up : bytes_[size_t(layer)].down;
      check_cuda(cudaMemcpy(slots + at, host_bytes(layer, p, expert), n, cudaMemcpyHostToDevice), "an expert to its slot");
      at += n;
    }
  }
}

// Where the kernels find projection p of expert `index` ([layer][expert]): in `slot` of VRAM, or
// (slot -1) at its pinned host bytes.
const void* ExpertTier::pointer_of(int64_t index, int p, int64_t slot) const {
  const int64_t l = index / n_experts_;
  if (slot < 0 && lent_[size_t(index)]) return lent_at_[size_t(index)][size_t(p)];
  if (slot < 0) return device_view(host_bytes(l, p, index % n_experts_));
  const plan::ExpertBytes& b = bytes_[size_t(l)];
  return slots_.as<uint8_t>() + size_t(slot) * slot_bytes_ + (p > 0 ? b.gate : 0) + (p > 1 ? b.up : 0);
}

void ExpertTier::upload_tables() {
  std::vector<const void*> pointers(size_t(n_layers_ * 3 * n_experts_));
  std::vector<uint8_t> flags(slot_of_.size());
  for (int64_t i = 0; i < int64_t(slot_of_.size()); ++i) {
    flags[size_t(i)] = slot_of_[size_t(i)] >= 0 || lent_[size_t(i)];
    for (int p = 0; p < 3; ++p)
      pointers[size_t(((i / n_experts_) * 3 + p) * n_experts_ + i % n_experts_)] = pointer_of(i, p, slot_of_[size_t(i)]);
  }
  copy_to_device(tables_.data(), pointers.data(), pointers.size() * sizeof(void*));
  copy_to_device(flags_.data(), flags.data(), flags.size());
}

void ExpertTier::lend_in(const std::vector<Lent>& lent) {
  for (const Lent& e : lent) {
    if (e.layer < 0 || e.layer >= n_layers_ || e.expert < 0 || e.expert >= n_experts_)
      fail("expert tier: expert {} of layer {} lent in is outside this tier's {} layers of {}", e.expert, e.layer,
           n_layers_, n_experts_);
    const size_t i = size_t(e.layer * n_experts_ + e.expert);
    if (slot_of_[i] >= 0 || lent_[i])
      fail("expert tier: expert {} of layer {} is lent in but already held", e.expert, e.layer);
    lent_[i] = 1, lent_at_[i] = e.projections, ++lent_count_;
    if (!where_.empty()) where_[i] = plan::Residency::busy;  // the swaps never move it
  }
  upload_tables();
}

void ExpertTier::enable_swaps(const plan::SwapOptions& options, const unsigned* device_counts) {
  if (!options.enabled || all_resident_ || resident_count_ == 0) return;  // nothing could move
  policy_ = std::make_unique<plan::SwapPolicy>(int64_t(slot_of_.size()), options);
  device_counts_ = device_counts;
  where_.resize(slot_of_.size());
  for (size_t i = 0; i < slot_of_.size(); ++i)
    where_[i] = slot_of_[i] >= 0 ? plan::Residency::resident : plan::Residency::absent;
  for (size_t i = 0; i < slot_of_.size(); ++i)
    if (lent_[i]) where_[i] = plan::Residency::busy;  // (never chosen, either way)
  check_cuda(cudaMallocHost(&host_counts_, slot_of_.size() * sizeof(unsigned)), "pinned memory");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating the expert copy stream");
  copy_stream_ = stream;
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an event");
  counts_copied_ = e;
  check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an event");
  evicted_ = e;
}

// Newcomers whose bytes have landed in their slots: the tables point there from the next step on.
void ExpertTier::land_copies(void* step_stream) {
  kernels::ExpertEntries entries;
  const auto flush = [&] {
    check(kernels::set_experts(tables_.as<const void*>(), flags_.as<uint8_t>(), n_experts_, entries, step_stream),
          "pointing the tables at swapped-in experts");
    entries.count = 0;
  };
  for (size_t i = 0; i < pending_.size();) {
    const Pending p = pending_[i];
    if (cudaEventQuery(static_cast<cudaEvent_t>(p.copied)) != cudaSuccess) {
      cudaGetLastError();  // cudaErrorNotReady is no error here
      ++i;
      continue;
    }
    entries.at[entries.count++] = {p.newcomer, pointer_of(p.newcomer, 0, p.slot), pointer_of(p.newcomer, 1, p.slot),
                                   pointer_of(p.newcomer, 2, p.slot), 1};
    slot_of_[size_t(p.newcomer)] = p.slot;
    where_[size_t(p.newcomer)] = plan::Residency::resident;
    spare_events_.push_back(p.copied);
    pending_.erase(pending_.begin() + ptrdiff_t(i));
    ++swaps_;
    if (entries.count == kernels::kMaxExpertEntries) flush();
  }
  flush();
}

// Each victim's entries back to its host bytes (on the step stream), then, once the step stream has
// passed that point (no kernel can still read the victim's slot), the newcomer copied into it.
void ExpertTier::start_swaps(const std::vector<std::pair<int64_t, int64_t>>& pairs, void* step_stream) {
  if (pairs.empty()) return;
  for (size_t first = 0; first < pairs.size(); first += kernels::kMaxExpertEntries) {
    kernels::ExpertEntries evictions;
    for (size_t i = first; i < std::min(pairs.size(), first + kernels::kMaxExpertEntries); ++i) {
      const int64_t victim = pairs[i].second;
      evictions.at[evictions.count++] = {victim, pointer_of(victim, 0, -1), pointer_of(victim, 1, -1),
                                         pointer_of(victim, 2, -1), 0};
    }
    check(kernels::set_experts(tables_.as<const void*>(), flags_.as<uint8_t>(), n_experts_, evictions, step_stream),
          "pointing the tables at evicted experts' host bytes");
  }
  const auto copy = static_cast<cudaStream_t>(copy_stream_);
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(evicted_), static_cast<cudaStream_t>(step_stream)), "a swap");
  check_cuda(cudaStreamWaitEvent(copy, static_cast<cudaEvent_t>(evicted_)), "a swap");
  for (const auto& [newcomer, victim] : pairs) {
    const int64_t slot = slot_of_[size_t(victim)], layer = newcomer / n_experts_;
    slot_of_[size_t(victim)] = -1;
    where_[size_t(victim)] = plan::Residency::absent;
    where_[size_t(newcomer)] = plan::Residency::busy;
    uint8_t* at = slots_.as<uint8_t>() + size_t(slot) * slot_bytes_;
    for (int p = 0; p < 3; ++p) {
      const plan::ExpertBytes& b = bytes_[size_t(layer)];
      const size_t n = p == 0 ? b.gate : p == 1 ? b.up : b.down;
      check_cuda(cudaMemcpyAsync(at, host_bytes(layer, p, newcomer % n_experts_), n, cudaMemcpyHostToDevice, copy),
                 "an expert into its slot");
      at += n;
    }
    cudaEvent_t done = nullptr;
    if (!spare_events_.empty()) {
      done = static_cast<cudaEvent_t>(spare_events_.back());
      spare_events_.pop_back();
    } else {
      check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "creating an event");
    }
    check_cuda(cudaEventRecord(done, copy), "a swap");
    pending_.push_back({newcomer, slot, done});
  }
}

void ExpertTier::between_steps(void* step_stream) {
  if (!policy_) return;
  land_copies(step_stream);
  if (++steps_ % policy_->options().every != 0) return;
  const auto counts_event = static_cast<cudaEvent_t>(counts_copied_);
  if (counts_in_flight_) {
    if (cudaEventQuery(counts_event) != cudaSuccess) {
      cudaGetLastError();
      return;  // next round
    }
    policy_->observe(std::vector<uint64_t>(host_counts_, host_counts_ + slot_of_.size()));
    counts_in_flight_ = false;
    if (int64_t(pending_.size()) < policy_->options().per_round) start_swaps(policy_->choose(where_), step_stream);
  }
  check_cuda(cudaMemcpyAsync(host_counts_, device_counts_, slot_of_.size() * sizeof(unsigned), cudaMemcpyDeviceToHost,
                             static_cast<cudaStream_t>(step_stream)),
             "routing counts for the swaps");
  check_cuda(cudaEventRecord(counts_event, static_cast<cudaStream_t>(step_stream)), "routing counts for the swaps");
  counts_in_flight_ = true;
}

const void* const* ExpertTier::table(int64_t layer) const {
  return tables_.as<const void*>() + layer * 3 * n_experts_;
}

const uint8_t* ExpertTier::resident_flags(int64_t layer) const { return flags_.as<uint8_t>() + layer * n_experts_; }

}  // namespace lode::cuda
