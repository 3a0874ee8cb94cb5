#include "cuda/expert_tier.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "cuda/errors.h"

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

void ExpertTier::upload_tables() {
  std::vector<const void*> pointers(size_t(n_layers_ * 3 * n_experts_));
  std::vector<uint8_t> flags(slot_of_.size());
  const auto* slots = slots_.as<uint8_t>();
  for (int64_t l = 0; l < n_layers_; ++l)
    for (int64_t e = 0; e < n_experts_; ++e) {
      const int64_t slot = slot_of_[size_t(l * n_experts_ + e)];
      flags[size_t(l * n_experts_ + e)] = slot >= 0;
      size_t at = size_t(std::max<int64_t>(slot, 0)) * slot_bytes_;
      for (int p = 0; p < 3; ++p) {
        const void* where = slot >= 0 ? static_cast<const void*>(slots + at) : device_view(host_bytes(l, p, e));
        pointers[size_t((l * 3 + p) * n_experts_ + e)] = where;
        at += p == 0 ? bytes_[size_t(l)].gate : p == 1 ? bytes_[size_t(l)].up : bytes_[size_t(l)].down;
      }
    }
  copy_to_device(tables_.data(), pointers.data(), pointers.size() * sizeof(void*));
  copy_to_device(flags_.data(), flags.data(), flags.size());
}

const void* const* ExpertTier::table(int64_t layer) const {
  return tables_.as<const void*>() + layer * 3 * n_experts_;
}

const uint8_t* ExpertTier::resident_flags(int64_t layer) const { return flags_.as<uint8_t>() + layer * n_experts_; }

}  // namespace lode::cuda
