// The CPU engine against transformers: each fixture checkpoint (tests/data/fixtures, made by
// tools/fixtures/make_fixtures.py with transformers in float32) is converted with lode convert
// and run; logits must match transformers' to relative L2 <= 1e-4 per prompt, with the same
// argmax at every position and the same greedy continuation. Chunk sizes must not matter.
#include <gtest/gtest.h>

#include <algorithm>

#include "cpu/session.h"
#include "gguf/reader.h"
#include "support/fixtures.h"
#include "test_gguf_helpers.h"

namespace {

using lode::test::relative_l2;

int32_t argmax(const float* row, int64_t n) { return int32_t(std::max_element(row, row + n) - row); }

class TransformersParity : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    fixture_ = lode::test::load_fixture(GetParam());
    gguf_ = tmp_ / "model.gguf";
    lode::test::convert_fixture(fixture_, gguf_);
  }
  lode::test::TempDir tmp_;
  lode::test::Fixture fixture_;
  std::filesystem::path gguf_;
};

TEST_P(TransformersParity, LogitsArgmaxAndGreedyMatch) {
  const lode::gguf::Reader reader(gguf_);
  const auto config = lode::model::read_config(reader.metadata());
  lode::cpu::Session session(reader, config);
  const int64_t vocab = session.vocab();
  for (const auto& prompt : fixture_.prompts) {
    const std::string label = prompt.logits.filename().string();
    SCOPED_TRACE(label);
    session.reset();
    const std::vector<float> ours = session.prefill(prompt.ids, 64, true);
    const std::vector<float> want = lode::test::read_floats(prompt.logits);
    ASSERT_EQ(ours.size(), want.size());
    const double err = relative_l2(ours, want);
    EXPECT_LE(err, 1e-4);
    std::printf("[ parity ] transformers %s %s: %zu tokens, relative L2 %.3g\n", GetParam().c_str(),
                label.c_str(), prompt.ids.size(), err);
    for (size_t t = 0; t < prompt.ids.size(); ++t)
      EXPECT_EQ(argmax(&ours[t * vocab], vocab), argmax(&want[t * vocab], vocab)) << "position " << t;
    // Greedy continuation through the decode path.
    std::vector<int32_t> generated;
    std::vector<float> logits(ours.end() - vocab, ours.end());
    for (size_t i = 0; i < prompt.greedy.size(); ++i) {
      generated.push_back(argmax(logits.data(), vocab));
      if (i + 1 < prompt.greedy.size()) logits = session.decode(generated.back());
    }
    EXPECT_EQ(generated, prompt.greedy);
  }
}

TEST_P(TransformersParity, ChunkSizesAgree) {
  const lode::gguf::Reader reader(gguf_);
  const auto config = lode::model::read_config(reader.metadata());
  lode::cpu::Session session(reader, config);
  const std::vector<int32_t>& ids = fixture_.prompts.back().ids;
  const std::vector<float> whole = session.prefill(ids, int64_t(ids.size()), true);
  for (int64_t chunk : {1, 7, 64}) {
    session.reset();
    const std::vector<float> chunked = session.prefill(ids, chunk, true);
    EXPECT_LE(relative_l2(chunked, whole), 1e-4) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TransformersParity, ::testing::Values("tiny_flat", "tiny_nested"));

}  // namespace
