// The expert tier (DESIGN.md "The expert tier"): every routed expert stays in host RAM as the file
// stores it, pinned so the GPU can read it over PCIe (the file's mapping registered in place, or
// a pinned copy where that fails); the ones the plan has room for also live in VRAM slots. The
// kernels reach experts through one device-side table per layer: 3 n pointers (gate of expert e
// at e, up at n + e, down at 2n + e), each at the expert's slot or at its pinned host bytes, so a
// product reads a resident expert from VRAM and an absent one in place over PCIe, with the same
// kernel and the same arithmetic (the tokens cannot depend on where an expert is). Residency
// flags beside the table let the router kernels count misses. Host code; needs the CUDA runtime.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/vram.h"
#include "model/weights.h"
#include "plan/memory_plan.h"
#include "plan/swap_policy.h"

namespace lode::cuda {

class ExpertTier {
 public:
  // Allocates the slots (experts) and the tables and flags (weights) through `vram`, as the plan says.
  ExpertTier(const model::ModelWeights& weights, const plan::MemoryPlan& plan, VramAccountant& vram);
  // Pins the host tier (unless every expert is resident; fails clearly when host memory cannot be
  // pinned) and places plan.experts_resident experts in VRAM: the highest `scores` first
  // ([layer][expert]; empty: all equal), ties in a fixed pseudo-random order that spreads them over
  // the layers; then fills the tables. Call it after the trunk is uploaded: the registered ranges are
  // whole pages, which may reach into the neighbouring tensors of the file's mapping, and a copy
  // that starts inside a registered range must end inside it.
  void load(const std::vector<double>& scores = {});
  ~ExpertTier();
  ExpertTier(const ExpertTier&) = delete;
  ExpertTier& operator=(const ExpertTier&) = delete;

  // Layer l's (expert -> gate | up | down) table and residency flags (device memory).
  const void* const* table(int64_t layer) const;
  const uint8_t* resident_flags(int64_t layer) const;
  bool resident(int64_t layer, int64_t expert) const {
    const size_t i = size_t(layer * n_experts_ + expert);
    return slot_of_[i] >= 0 || lent_[i];
  }
  int64_t resident_count() const { return resident_count_ + lent_count_; }  // lent ones included

  // Experts of this tier's layers that another GPU holds in its VRAM for it (several GPUs,
  // cuda/pipeline.h): the kernels read each there in place (peer access), with the same products.
  // They count as resident and never move. Call after load() and enable_swaps(); each must be
  // absent here.
  struct Lent {
    int64_t layer = 0, expert = 0;
    std::array<const void*, 3> projections{};  // gate, up, down on the other GPU
  };
  void lend_in(const std::vector<Lent>& lent);
  // Bytes of one expert of layer l as stored (what a miss reads over PCIe).
  size_t expert_bytes(int64_t layer) const { return bytes_[size_t(layer)].total(); }
  // Projection p (0 gate, 1 up, 2 down) of expert e of layer l: where the kernels read it now (its
  // slot, or its pinned host bytes as the device sees them); its host bytes (pinned: a copy
  // engine's source); its size.
  const void* device_pointer(int64_t layer, int p, int64_t expert) const {
    const int64_t index = layer * n_experts_ + expert;
    return pointer_of(index, p, slot_of_[size_t(index)]);
  }
  const uint8_t* host_pointer(int64_t layer, int p, int64_t expert) const { return host_bytes(layer, p, expert); }
  size_t projection_bytes(int64_t layer, int p) const {
    const plan::ExpertBytes& b = bytes_[size_t(layer)];
    return p == 0 ? b.gate : p == 1 ? b.up : b.down;
  }
  // How the host tier is held: "registered in place", "a pinned copy", or "none (every expert is in VRAM)".
  const std::string& host_tier() const { return host_tier_; }

  // Adaptive placement (plan/swap_policy.h) from the routing counts at `device_counts`
  // ([layer][expert], device memory, only ever added to). Call between_steps() after each decode
  // step, with the step's stream (a cudaStream_t) idle: every options.every steps it reads the
  // counts copied after the previous round, starts the swaps the policy chooses (each victim's
  // table entries back to its host bytes on the step's stream, then its slot filled with the
  // newcomer on the tier's own copy stream once every step that might still read the victim there
  // has finished), and points the tables at the newcomers whose copies have landed. It never waits
  // for the GPU.
  void enable_swaps(const plan::SwapOptions& options, const unsigned* device_counts);
  void between_steps(void* step_stream);
  int64_t swaps() const { return swaps_; }

 private:
  struct HostRange {
    const uint8_t* begin;
    size_t bytes;
    const uint8_t* device;  // where the GPU sees it
  };
  // Host (and device) address of expert e's projection p (0 gate, 1 up, 2 down) of layer l.
  const uint8_t* host_bytes(int64_t layer, int p, int64_t expert) const;
  const uint8_t* device_view(const uint8_t* host) const;
  void pin_host_tier();
  void copy_host_tier();
  void place(const std::vector<double>& scores);
  void upload_tables();
  struct Pending {
    int64_t newcomer, slot;
    void* copied;  // a cudaEvent_t on the copy stream
  };
  void land_copies(void* step_stream);
  void start_swaps(const std::vector<std::pair<int64_t, int64_t>>& pairs, void* step_stream);
  const void* pointer_of(int64_t index, int p, int64_t slot) const;

  const model::ModelWeights& weights_;
  int64_t n_layers_, n_experts_;
  std::vector<plan::ExpertBytes> bytes_;
  size_t slot_bytes_;
  std::vector<HostRange> registered_;        // pinned host memory: the mapping's ranges, or the copy
  void* pinned_copy_ = nullptr;              // or one pinned copy of every expert
  std::vector<size_t> copy_offset_;          // [layer][projection]: its stack's offset in the copy
  std::string host_tier_;
  std::vector<int64_t> slot_of_;             // [layer][expert]: its VRAM slot, or -1
  std::vector<uint8_t> lent_;                // [layer][expert]: held by another GPU (lend_in)
  std::vector<std::array<const void*, 3>> lent_at_;  // and where
  int64_t lent_count_ = 0;
  int64_t resident_count_ = 0;
  bool all_resident_ = false;
  size_t experts_host_ = 0;
  DeviceBuffer slots_, tables_, flags_;
  // Adaptive placement.
  std::unique_ptr<plan::SwapPolicy> policy_;
  std::vector<plan::Residency> where_;
  const unsigned* device_counts_ = nullptr;
  unsigned* host_counts_ = nullptr;          // pinned: the counts copied after the last round
  void* counts_copied_ = nullptr;            // cudaEvent_t
  bool counts_in_flight_ = false;
  void* copy_stream_ = nullptr;              // cudaStream_t
  void* evicted_ = nullptr;                  // cudaEvent_t: the step stream past a round's evictions
  std::vector<Pending> pending_;
  std::vector<void*> spare_events_;
  int64_t steps_ = 0, swaps_ = 0;
};

}  // namespace lode::cuda
