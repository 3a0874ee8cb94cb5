// The transformers fixtures (tests/data/fixtures/<name>, made by tools/fixtures/make_fixtures.py):
// prompts with transformers' float32 logits and greedy continuations, and the checkpoint itself,
// converted here with lode convert.
#pragma once
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/convert.h"
#include "support/paths.h"
#include "support/run_lode.h"

namespace lode::test {

struct FixturePrompt {
  std::vector<int32_t> ids;
  std::vector<int32_t> greedy;     // transformers' greedy continuation
  std::filesystem::path logits;    // [n_tokens, vocab] float32
};

struct Fixture {
  std::string name;
  std::filesystem::path dir, checkpoint;
  std::vector<FixturePrompt> prompts;
};

inline Fixture load_fixture(const std::string& name) {
  Fixture f;
  f.name = name;
  f.dir = lode::test::test_data() / "fixtures" / name;
  std::ifstream in(f.dir / "prompts.json");
  if (!in) throw std::runtime_error("missing " + (f.dir / "prompts.json").string());
  const auto j = nlohmann::json::parse(in);
  f.checkpoint = f.dir / j["model_dir"].get<std::string>();
  for (const auto& p : j["prompts"])
    f.prompts.push_back({p["ids"].get<std::vector<int32_t>>(), p["greedy"].get<std::vector<int32_t>>(),
                         f.dir / p["logits_file"].get<std::string>()});
  return f;
}

// `lode convert` of the fixture's checkpoint into `out`.
inline void convert_fixture(const Fixture& f, const std::filesystem::path& out,
                            GgmlType outtype = GgmlType::F32) {
  model::ConvertOptions options;
  options.outtype = outtype;
  model::convert_checkpoint(f.checkpoint, out, options);
}

inline std::vector<float> read_floats(const std::filesystem::path& p) {
  const std::string bytes = slurp(p);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// ||a - b|| / ||b||
inline double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < b.size() && i < a.size(); ++i) {
    err += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    ref += double(b[i]) * b[i];
  }
  return std::sqrt(err / ref);
}

}  // namespace lode::test
