// The expert tier's one kernel: new entries for the (layer, expert) tables and residency flags,
// queued on the step's stream between steps, so a swap takes effect for the kernels after it and
// for none before. No CUDA types here.
#pragma once
#include <cstdint>

namespace lode::cuda::kernels {

struct ExpertEntry {
  int64_t index = 0;     // layer * n_experts + expert
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* down = nullptr;
  uint8_t resident = 0;  // 1: the pointers are its VRAM slot's; 0: its pinned host bytes
};
constexpr int kMaxExpertEntries = 16;
struct ExpertEntries {  // passed by value: the launch keeps its own copy
  int count = 0;
  ExpertEntry at[kMaxExpertEntries];
};

// tables: [layer][gate | up | down][n_experts] pointers; flags: [layer][n_experts].
const char* set_experts(const void** tables, uint8_t* flags, int64_t n_experts, const ExpertEntries& entries,
                        void* stream);

}  // namespace lode::cuda::kernels
