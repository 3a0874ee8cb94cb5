// Routing profiles (plan/routing_profile.h): written and read back whole; a profile recorded on
// another model (other geometry, or other routers) is refused naming the difference; a damaged
// file is refused naming the file.
#include <gtest/gtest.h>

#include <fstream>
#include <numeric>
#include <string>

#include "core/error.h"
#include "gguf/reader.h"
#include "model/synth.h"
#include "model/weights.h"
#include "plan/routing_profile.h"
#include "support/paths.h"
#include "test_gguf_helpers.h"

namespace {

using namespace lode;

plan::RoutingProfile profile_of(const model::ModelWeights& w) {
  plan::RoutingProfile p;
  p.model_name = "test";
  p.fingerprint = plan::routing_fingerprint(w);
  p.layers = w.config.n_layers, p.experts = w.config.n_experts, p.tokens = 12;
  p.counts.resize(size_t(p.layers * p.experts));
  std::iota(p.counts.begin(), p.counts.end(), uint64_t(3));
  return p;
}

TEST(RoutingProfile, RoundTripsAndPlacesByItsCounts) {
  const lode::test::TempDir dir;
  const gguf::Reader r(lode::test::mini_model_path());
  const model::ModelWeights w = model::bind_weights(r, model::read_config(r.metadata()));
  const plan::RoutingProfile p = profile_of(w);
  plan::write_profile(dir / "p.json", p);
  const plan::RoutingProfile back = plan::read_profile(dir / "p.json");
  EXPECT_EQ(back.counts, p.counts);
  EXPECT_EQ(back.fingerprint, p.fingerprint);
  EXPECT_EQ(back.tokens, 12u);
  const std::vector<double> scores = plan::placement_scores(back, w);
  ASSERT_EQ(scores.size(), p.counts.size());
  EXPECT_EQ(scores[5], double(p.counts[5]));
}

TEST(RoutingProfile, AProfileForAnotherModelIsRefused) {
  const lode::test::TempDir dir;
  const gguf::Reader mini(lode::test::mini_model_path());
  const model::ModelWeights w = model::bind_weights(mini, model::read_config(mini.metadata()));
  model::SynthOptions o;
  o.preset = "tiny";
  model::write_synth(dir / "tiny.gguf", o);
  const gguf::Reader tiny(dir / "tiny.gguf");
  const model::ModelWeights other = model::bind_weights(tiny, model::read_config(tiny.metadata()));
  try {
    plan::placement_scores(profile_of(other), w);
    ADD_FAILURE() << "a profile of another geometry was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
  }
  plan::RoutingProfile same_shape = profile_of(w);
  same_shape.fingerprint = "0123456789abcdef";  // the same geometry, other routers
  try {
    plan::placement_scores(same_shape, w);
    ADD_FAILURE() << "a profile of other routers was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("routers hash"), std::string::npos) << e.what();
  }
}

TEST(RoutingProfile, DamagedFilesAreRefusedNamingTheFile) {
  const lode::test::TempDir dir;
  std::ofstream(dir / "bad.json") << "{\"lode_routing_profile\": 1, \"model\": {\"name\": \"x\"}}";
  std::ofstream(dir / "not.json") << "not json at all";
  const auto with_counts = [](const std::string& counts, const std::string& tokens) {
    return "{\"lode_routing_profile\": 1, \"model\": {\"name\": \"x\", \"layers\": 1, \"experts\": 2, "
           "\"routers\": \"h\"}, \"tokens\": " + tokens + ", \"counts\": [" + counts + "]}";
  };
  std::ofstream(dir / "negative.json") << with_counts("[-1, 5]", "3");  // (it wrapped to 2^64 - 1)
  std::ofstream(dir / "huge.json") << with_counts("[1e300, 5]", "3");
  std::ofstream(dir / "zero.json") << with_counts("[0, 0]", "3");
  std::ofstream(dir / "tokens.json") << with_counts("[1, 5]", "-3");
  std::filesystem::create_directory(dir / "folder.json");  // (an internal error once)
  std::ofstream(dir / "good.json") << with_counts("[1, 5]", "3");
  EXPECT_EQ(plan::read_profile(dir / "good.json").counts, (std::vector<uint64_t>{1, 5}));
  for (const char* name : {"bad.json", "not.json", "missing.json", "negative.json", "huge.json", "zero.json",
                           "tokens.json", "folder.json"}) {
    try {
      plan::read_profile(dir / name);
      ADD_FAILURE() << name << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

}  // namespace
