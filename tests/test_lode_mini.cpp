// lode-mini (models/lode-mini.gguf, trained by tools/mini, docs/MINI.md) as a real-text check of
// the whole CPU path: its held-out perplexity is far below what an untrained model gets, it
// continues a famous verse with the corpus's words, and lode chat holds a turn with it (reasoning
// closed by </think>, then an answer).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "cpu/engine.h"
#include "engine/perplexity.h"
#include "gguf/reader.h"
#include "model/qwen35moe.h"
#include "support/paths.h"
#include "support/run_lode.h"
#include "test_gguf_helpers.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
const fs::path kRepo = lode::test::repo_root();
const fs::path kMini = kRepo / "models/lode-mini.gguf";

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(LodeMini, HeldOutPerplexityIsFarBelowAnUntrainedModels) {
  const lode::gguf::Reader reader(kMini);
  const auto config = lode::model::read_config(reader.metadata());
  EXPECT_EQ(config.n_mtp_layers, 1);  // the MTP block came through lode convert
  const auto tok = lode::tokenizer::Tokenizer::from_metadata(reader.metadata());
  EXPECT_EQ(tok.pre_name(), "qwen35");
  const auto ids = tok.encode(read_text(kRepo / "tests/data/mini/heldout_sample.txt"), false);
  lode::cpu::Session session(reader, config, {.threads = 1});
  const auto r = lode::engine::perplexity(*lode::cpu::borrow_sequence(session), ids, {.ctx = 512, .chunk = 64, .max_windows = 4});
  // Uniform guessing over the 8,192 tokens is a perplexity of 8192 and the training corpus's
  // unigram distribution scores about 1,260 (docs/MINI.md); lode-mini scores 18.1 on these four 512-token windows.
  EXPECT_LT(r.perplexity(), 40.0);
  EXPECT_GT(r.perplexity(), 3.0);
}

TEST(LodeMini, ContinuesAVerseWithTheCorpussWords) {
  const lode::test::TempDir dir;
  const auto r = lode::test::run_lode(
      "run -m '" + kMini.string() + "' -p 'Genesis 1:1 In the beginning God created the' -n 8 --temp 0 --threads 1 --backend cpu",
      dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("earth"), std::string::npos) << r.out;
}

TEST(LodeMini, ChatHoldsATurnWithReasoningThenAnAnswer) {
  const lode::test::TempDir dir;
  std::ofstream(dir / "turn.txt") << "What does the ls command do?\n";
  const auto r = lode::test::run_lode("chat -m '" + kMini.string() + "' -n 120 --temp 0 --threads 1 --backend cpu < '" +
                                          (dir / "turn.txt").string() + "'",
                                      dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  // Not a terminal: reasoning is shown between <think> tags, then the answer.
  const size_t open = r.out.find("<think>\n"), close = r.out.find("\n</think>\n");
  ASSERT_NE(open, std::string::npos) << r.out;
  ASSERT_NE(close, std::string::npos) << r.out;
  EXPECT_GT(close, open + 20) << "no reasoning: " << r.out;
  EXPECT_GT(r.out.size(), close + 30) << "no answer after the reasoning: " << r.out;
  EXPECT_NE(r.out.find("ls"), std::string::npos) << r.out;
}

}  // namespace
