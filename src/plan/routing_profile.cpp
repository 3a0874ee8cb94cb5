#include "plan/routing_profile.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

#include "core/error.h"

namespace lode::plan {

std::string routing_fingerprint(const model::ModelWeights& w) {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a over every router's bytes
  for (const model::LayerWeights& l : w.layers) {
    const model::MatrixView& r = l.moe.router;
    const size_t bytes = size_t(r.rows) * r.row_bytes;
    for (size_t i = 0; i < bytes; ++i) hash = (hash ^ r.data[i]) * 0x100000001b3ull;
  }
  return fmt::format("{:016x}", hash);
}

void write_profile(const std::filesystem::path& path, const RoutingProfile& p) {
  nlohmann::json counts = nlohmann::json::array();
  for (int64_t l = 0; l < p.layers; ++l)
    counts.push_back(std::vector<uint64_t>(p.counts.begin() + l * p.experts, p.counts.begin() + (l + 1) * p.experts));
  const nlohmann::ordered_json j = {{"lode_routing_profile", 1},
                                    {"model", {{"name", p.model_name}, {"layers", p.layers}, {"experts", p.experts},
                                               {"routers", p.fingerprint}}},
                                    {"tokens", p.tokens},
                                    {"counts", counts}};
  std::ofstream out(path);
  out << j.dump(1) << "\n";
  if (!out) fail("{}: cannot write the routing profile", path.string());
}

RoutingProfile read_profile(const std::filesystem::path& path) {
  if (!std::filesystem::is_regular_file(path))
    fail("{}: not a file (a routing profile is made by lode profile)", path.string());
  std::ifstream in(path);
  if (!in) fail("{}: cannot open the routing profile (make one with lode profile)", path.string());
  RoutingProfile p;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.value("lode_routing_profile", 0) != 1) fail("not a lode routing profile (version 1)");
    const nlohmann::json& m = j.at("model");
    p.model_name = m.at("name").get<std::string>();
    p.layers = m.at("layers").get<int64_t>();
    p.experts = m.at("experts").get<int64_t>();
    p.fingerprint = m.at("routers").get<std::string>();
    // (counts are whole numbers: a negative one would wrap, 1e300 would not convert)
    const auto count = [](const nlohmann::json& v, const char* what) {
      if (!v.is_number_unsigned()) fail("{} {} is not a count (a non-negative integer)", what, v.dump());
      return v.get<uint64_t>();
    };
    p.tokens = count(j.at("tokens"), "tokens");
    const nlohmann::json& counts = j.at("counts");
    if (int64_t(counts.size()) != p.layers) fail("{} rows of counts for {} layers", counts.size(), p.layers);
    for (const auto& row : counts) {
      if (int64_t(row.size()) != p.experts) fail("a row of {} counts for {} experts", row.size(), p.experts);
      for (const auto& c : row) p.counts.push_back(count(c, "a routing count"));
    }
    if (std::all_of(p.counts.begin(), p.counts.end(), [](uint64_t c) { return c == 0; }))
      fail("it recorded no routings");
  } catch (const nlohmann::json::exception& e) {
    fail("{}: a malformed routing profile: {}", path.string(), e.what());
  } catch (const Error& e) {
    fail("{}: {}", path.string(), e.what());
  }
  return p;
}

std::vector<double> placement_scores(const RoutingProfile& p, const model::ModelWeights& w) {
  const model::Qwen35MoeConfig& c = w.config;
  if (p.layers != c.n_layers || p.experts != c.n_experts)
    fail("the routing profile is for another model: {} layers of {} experts (recorded on '{}'), this one has {} of {}",
         p.layers, p.experts, p.model_name, c.n_layers, c.n_experts);
  if (const std::string mine = routing_fingerprint(w); p.fingerprint != mine)
    fail("the routing profile is for another model: recorded on '{}' whose routers hash to {}, this model's hash to "
         "{}; record one for it with lode profile",
         p.model_name, p.fingerprint, mine);
  return {p.counts.begin(), p.counts.end()};
}

}  // namespace lode::plan
