// --expert-profile FILE: a routing profile (plan/routing_profile.h, made by `lode profile`) that
// decides which experts the GPU session places in VRAM first.
#pragma once
#include <string>
#include <vector>

#include "model/weights.h"
#include "plan/miss_split.h"

namespace CLI {
class App;
}

namespace lode::cli {

void add_expert_profile_option(CLI::App& cmd, std::string& path);
// --expert-swaps on|off: adaptive placement between decode steps, or the placement frozen as loaded.
void add_expert_swaps_option(CLI::App& cmd, std::string& on_or_off);
// --miss-path auto|gpu|cpu: who computes a decode step's experts that are not in VRAM.
void add_miss_path_option(CLI::App& cmd, std::string& path);
plan::MissPath miss_path_from(const std::string& name);
// The placement scores of the profile at `path` for these weights; fails clearly when the file is
// missing, malformed or recorded on another model.
std::vector<double> expert_scores_from(const std::string& path, const model::ModelWeights& weights);

}  // namespace lode::cli
