#include "cli/expert_profile.h"

#include <CLI/CLI.hpp>

#include "plan/routing_profile.h"

namespace lode::cli {

void add_expert_profile_option(CLI::App& cmd, std::string& path) {
  cmd.add_option("--expert-profile", path,
                 "A routing profile (lode profile) whose most-chosen experts go to VRAM first (default: an even "
                 "spread over the layers)");
}

void add_expert_swaps_option(CLI::App& cmd, std::string& on_or_off) {
  cmd.add_option("--expert-swaps", on_or_off,
                 "on (default): between decode steps the most-routed experts not in VRAM replace the least-routed "
                 "ones there; off: the placement stays as loaded (reproducible timings; the tokens are the same "
                 "either way)")
      ->check(CLI::IsMember({"on", "off"}));
}

void add_miss_path_option(CLI::App& cmd, std::string& path) {
  cmd.add_option("--miss-path", path,
                 "Who computes a decode step's experts that are not in VRAM: auto (default: the CPU takes a share "
                 "of each layer's, by costs measured at start and tuned on step times), gpu (read over PCIe), cpu "
                 "(all on the CPU; a step of several rows: up to 64 (expert, row) pairs a layer); the "
                 "tokens are the same either way")
      ->check(CLI::IsMember({"auto", "gpu", "cpu"}));
}

plan::MissPath miss_path_from(const std::string& name) {
  return name == "gpu" ? plan::MissPath::gpu : name == "cpu" ? plan::MissPath::cpu : plan::MissPath::automatic;
}

std::vector<double> expert_scores_from(const std::string& path, const model::ModelWeights& weights) {
  return plan::placement_scores(plan::read_profile(path), weights);
}

}  // namespace lode::cli
