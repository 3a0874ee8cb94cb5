// A routing profile: how often each (layer, expert) was chosen on real text (`lode profile`), so a
// later run places the hot experts in VRAM first (--expert-profile). Stored as JSON with the model
// it was recorded on (its name, geometry and a fingerprint of its routers), so a profile for
// another model is refused instead of silently placing the wrong experts.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/weights.h"

namespace lode::plan {

struct RoutingProfile {
  std::string model_name;      // general.name of the file it was recorded on
  std::string fingerprint;     // of the routers' bytes (routing_fingerprint)
  int64_t layers = 0, experts = 0;
  uint64_t tokens = 0;         // tokens the counts cover
  std::vector<uint64_t> counts;  // [layer][expert]
};

// A hash of every layer's router bytes, as hex: the same for the same weights in any file.
std::string routing_fingerprint(const model::ModelWeights& weights);

void write_profile(const std::filesystem::path& path, const RoutingProfile& profile);
// Fails (lode::Error) naming the file on a missing or malformed profile.
RoutingProfile read_profile(const std::filesystem::path& path);
// The profile's counts as placement scores for `weights` ([layer][expert]); fails when the profile
// was recorded on another model (other geometry or routers), saying which.
std::vector<double> placement_scores(const RoutingProfile& profile, const model::ModelWeights& weights);

}  // namespace lode::plan
