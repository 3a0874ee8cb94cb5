#include "cuda/sequence.h"

#include <fmt/format.h>

namespace lode::cuda {

std::string CudaSequence::activity() const {
  const ExpertStats s = session_->expert_stats();
  if (s.resident == s.total) return fmt::format("experts: all {} in VRAM", s.total);
  return fmt::format("experts: {} of {} in VRAM, hit rate {:.1f}%, {:.2f} GB over PCIe (decode {:.2f}, prompts {:.2f}), "
                     "{} swaps",
                     s.resident, s.total, 100.0 * s.hit_rate(), double(s.decode_miss_bytes + s.prompt_miss_bytes) / 1e9,
                     double(s.decode_miss_bytes) / 1e9, double(s.prompt_miss_bytes) / 1e9, s.swaps) +
         (s.cpu_experts ? fmt::format("; the CPU computed {} decode misses ({:.2f} GB from host RAM, {:.0f}% of them "
                                      "read ahead on a hint) in {:.2f} s",
                                      s.cpu_experts, double(s.cpu_expert_bytes) / 1e9,
                                      100.0 * double(s.cpu_hinted_experts) / double(s.cpu_experts), s.cpu_seconds)
                        : std::string());
}

}  // namespace lode::cuda
