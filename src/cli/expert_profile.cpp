#include "cli/expert_profile.h"

#include <CLI/CLI.hpp>

#include "plan/routing_profile.h"

namespace lode::cli {

void add_expert_profile_option(CLI::App& cmd, std::string& path) {
  cmd.add_option("--expert-profile", path,
                 "A routing profile (lode profile) whose most-chosen experts go to VRAM first (default: an even "
                 "spread over the layers)");
}

std::vector<double> expert_scores_from(const std::string& path, const model::ModelWeights& weights) {
  return plan::placement_scores(plan::read_profile(path), weights);
}

}  // namespace lode::cli
