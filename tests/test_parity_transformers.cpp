// The CPU engine against transformers: each fixture checkpoint (tests/data/fixtures, made by
// tools/fixtures/make_fixtures.py with transformers in float32) is converted with lode convert
// and run; logits must match transformers' to relative L2 <= 1e-4 per prompt, with the same
// argmax at every position and the same greedy continuation. Chunk sizes must not matter.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "cpu/session.h"
#include "gguf/reader.h"
#include "model/convert.h"
#include "test_gguf_helpers.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kFixtures = fs::path(LODE_TEST_DATA) / "fixtures";

std::vector<float> read_floats(const fs::path& p) {
  const std::vector<uint8_t> bytes = lode::test::read_bytes(p);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    err += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    ref += double(b[i]) * b[i];
  }
  return std::sqrt(err / ref);
}

int32_t argmax(const float* row, int64_t n) { return int32_t(std::max_element(row, row + n) - row); }

class TransformersParity : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    dir_ = kFixtures / GetParam();
    std::ifstream in(dir_ / "prompts.json");
    ASSERT_TRUE(in) << dir_;
    fixture_ = json::parse(in);
    gguf_ = tmp_ / "model.gguf";
    lode::model::convert_checkpoint(dir_ / fixture_["model_dir"].get<std::string>(), gguf_, {});
  }
  lode::test::TempDir tmp_;
  fs::path dir_, gguf_;
  json fixture_;
};

TEST_P(TransformersParity, LogitsArgmaxAndGreedyMatch) {
  const lode::gguf::Reader reader(gguf_);
  const auto config = lode::model::read_config(reader.metadata());
  lode::cpu::Session session(reader, config);
  const int64_t vocab = session.vocab();
  for (const auto& prompt : fixture_["prompts"]) {
    const std::vector<int32_t> ids = prompt["ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(prompt["logits_file"].get<std::string>());
    session.reset();
    const std::vector<float> ours = session.prefill(ids, 64, true);
    const std::vector<float> want = read_floats(dir_ / prompt["logits_file"].get<std::string>());
    ASSERT_EQ(ours.size(), want.size());
    const double err = relative_l2(ours, want);
    EXPECT_LE(err, 1e-4);
    std::printf("[ parity ] %s %s: %zu tokens, relative L2 %.3g\n", GetParam().c_str(),
                prompt["logits_file"].get<std::string>().c_str(), ids.size(), err);
    for (size_t t = 0; t < ids.size(); ++t)
      EXPECT_EQ(argmax(&ours[t * vocab], vocab), argmax(&want[t * vocab], vocab)) << "position " << t;
    // Greedy continuation through the decode path.
    const std::vector<int32_t> greedy = prompt["greedy"].get<std::vector<int32_t>>();
    std::vector<int32_t> generated;
    std::vector<float> logits(ours.end() - vocab, ours.end());
    for (size_t i = 0; i < greedy.size(); ++i) {
      generated.push_back(argmax(logits.data(), vocab));
      if (i + 1 < greedy.size()) logits = session.decode(generated.back());
    }
    EXPECT_EQ(generated, greedy);
  }
}

TEST_P(TransformersParity, ChunkSizesAgree) {
  const lode::gguf::Reader reader(gguf_);
  const auto config = lode::model::read_config(reader.metadata());
  lode::cpu::Session session(reader, config);
  const auto& longest = fixture_["prompts"].back();
  const std::vector<int32_t> ids = longest["ids"].get<std::vector<int32_t>>();
  const std::vector<float> whole = session.prefill(ids, int64_t(ids.size()), true);
  for (int64_t chunk : {1, 7, 64}) {
    session.reset();
    const std::vector<float> chunked = session.prefill(ids, chunk, true);
    EXPECT_LE(relative_l2(chunked, whole), 1e-4) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TransformersParity, ::testing::Values("tiny_flat", "tiny_nested"));

}  // namespace
