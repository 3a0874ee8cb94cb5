// The text commands as users meet them, on a tiny synthesized model that carries Qwen3's real
// tokenizer (skipped when tools/tokenizer/fetch has not run): tokenize / detokenize round trips,
// run -p streams text and reproduces with a seed, chat holds two turns on one growing cache.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "gguf/reader.h"
#include "model/synth.h"
#include "support/qwen_tokenizer.h"
#include "support/run_lode.h"
#include "test_gguf_helpers.h"

namespace {

using lode::test::run_lode;

class CliText : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!lode::test::qwen3_tokenizer_available()) return;
    dir_ = new lode::test::TempDir;
    lode::model::SynthOptions o;
    o.layers = 2;
    o.seed = 5;
    o.recipe = "q8_0";
    o.tokenizer_json = lode::test::kQwen3TokenizerJson;
    lode::model::write_synth(model(), o);
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override { LODE_REQUIRE_QWEN3_TOKENIZER(); }
  static std::filesystem::path model() { return *dir_ / "tiny-qwen3.gguf"; }
  static std::string m() { return "-m '" + model().string() + "' "; }
  lode::test::RunResult lode(const std::string& args) { return run_lode(args, scratch_.path()); }

  static inline lode::test::TempDir* dir_ = nullptr;
  lode::test::TempDir scratch_;
};

std::vector<int32_t> parse_ids(const std::string& line) {
  std::vector<int32_t> ids;
  std::istringstream in(line);
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

std::string joined(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

TEST_F(CliText, SynthEmbedsTheTokenizerAndGrowsTheVocabulary) {
  const lode::gguf::Reader r(model());
  EXPECT_EQ(r.metadata().get_string("tokenizer.ggml.pre"), "qwen2");
  const size_t vocab = r.metadata().get_array("tokenizer.ggml.tokens").size();
  EXPECT_EQ(vocab % 64, 0u);  // padded like real models' embeddings
  EXPECT_GE(vocab, 151669u);  // Qwen3's 151,643 BPE tokens and 26 added ones
}

TEST_F(CliText, TokenizeMatchesTheLibraryAndDetokenizeRoundTrips) {
  const std::string text = "Hello, world! 你好 <|im_start|>user";
  const auto& tok = lode::test::qwen3_tokenizer("qwen2");
  auto r = lode("tokenize " + m() + "-p '" + text + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(parse_ids(r.out), tok.encode(text, false));
  r = lode("tokenize " + m() + "-p '" + text + "' --special");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto special = parse_ids(r.out);
  EXPECT_EQ(special, tok.encode(text, true));
  EXPECT_EQ(special[special.size() - 2], 151644);  // <|im_start|>
  r = lode("detokenize " + m() + "--ids " + joined(special));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, text);
}

TEST_F(CliText, TokenizeAFileReportsTheSpeed) {
  const std::string text = "The quick brown fox jumps over the lazy dog.\n";
  std::ofstream(scratch_ / "in.txt") << text;
  const auto r = lode("tokenize " + m() + "-f '" + (scratch_ / "in.txt").string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(parse_ids(r.out), lode::test::qwen3_tokenizer("qwen2").encode(text, false));
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

TEST_F(CliText, RunStreamsTextAndASeedReproducesIt) {
  const std::string args = "run " + m() + "-p 'Once upon a time' -n 12 --temp 1.0 --ignore-eos --threads 1 --backend cpu ";
  const auto a = lode(args + "--seed 9"), b = lode(args + "--seed 9"), c = lode(args + "--seed 10");
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  EXPECT_NE(a.err.find("generated: 12 tokens"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("seed 9"), std::string::npos) << a.err;
  // The streamed text is the detokenized ids: --ids at temperature 0 gives the tokens, and the text
  // run prints (plus its final newline) is their text.
  const auto ids = lode("run " + m() + "-p 'Once upon a time' -n 6 --temp 0 --ids --threads 1 --backend cpu");
  const auto text = lode("run " + m() + "-p 'Once upon a time' -n 6 --temp 0 --ignore-eos --threads 1 --backend cpu");
  ASSERT_EQ(ids.status, 0) << ids.err;
  EXPECT_EQ(text.out, lode::test::qwen3_tokenizer("qwen2").decode(parse_ids(ids.out), false) + "\n");
}

TEST_F(CliText, RunRefusesBadInputClearly) {
  auto r = lode("run " + m() + "-n 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no prompt"), std::string::npos) << r.err;
  r = lode("run " + m() + "-p hi --top-p 1.5");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--top-p"), std::string::npos) << r.err;
  r = lode("run " + m() + "-p hi --logit-bias 12:x");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--logit-bias"), std::string::npos) << r.err;
  r = lode("run " + m() + "-p hi --activations q4");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--activations"), std::string::npos) << r.err;
}

// --activations q8 reaches the CPU engine: the q8_0 model's logits move (slightly) with it.
TEST_F(CliText, LogitsWithQ8ActivationsDiffer) {
  const auto out = [&](const char* name) { return "'" + (scratch_.path() / name).string() + "'"; };
  const auto f32 = lode("logits " + m() + "--backend cpu --tokens 9,8,7 -o " + out("f32.bin"));
  const auto q8 = lode("logits " + m() + "--backend cpu --tokens 9,8,7 -o " + out("q8.bin") + " --activations q8");
  ASSERT_EQ(f32.status, 0) << f32.err;
  ASSERT_EQ(q8.status, 0) << q8.err;
  const std::string a = lode::test::slurp(scratch_.path() / "f32.bin"), b = lode::test::slurp(scratch_.path() / "q8.bin");
  EXPECT_EQ(a.size(), b.size());
  EXPECT_FALSE(a.empty());
  EXPECT_NE(a, b);
}

TEST_F(CliText, ChatHoldsTwoTurnsOnOneCache) {
  std::ofstream(scratch_ / "turns.txt") << "Hello there\n/think off\nAnd a second question?\n";
  const auto r = lode("chat " + m() + "-n 8 --seed 1 --threads 1 --backend cpu < '" + (scratch_ / "turns.txt").string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  // One report per turn: "[prompt: P tokens ...; context C tokens]".
  const std::regex report(R"(\[prompt: (\d+) tokens.*context (\d+) tokens\])");
  std::vector<std::pair<int, int>> turns;
  for (std::sregex_iterator it(r.err.begin(), r.err.end(), report), end; it != end; ++it)
    turns.emplace_back(std::stoi((*it)[1]), std::stoi((*it)[2]));
  ASSERT_EQ(turns.size(), 2u) << r.err;
  // The first prompt is the rendered user turn; the second prefills only the new turn on top of
  // the context the first left (its prompt plus 8 generated tokens, the last still pending).
  const auto& tok = lode::test::qwen3_tokenizer("qwen2");
  EXPECT_EQ(turns[0].first, int(tok.encode("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n<think>\n", true).size()));
  EXPECT_EQ(turns[0].second, turns[0].first + 7);
  // (the pending token, then the previous reply's close and the new turn with thinking off)
  EXPECT_EQ(turns[1].first, 1 + int(tok.encode("<|im_end|>\n<|im_start|>user\nAnd a second question?<|im_end|>\n"
                                               "<|im_start|>assistant\n<think>\n\n</think>\n\n", true).size()));
  EXPECT_EQ(turns[1].second, turns[0].second + turns[1].first + 7);
  EXPECT_NE(r.err.find("thinking off"), std::string::npos);
}

TEST_F(CliText, DetokenizeRefusesIdsOutsideTheVocabulary) {
  const auto r = lode("detokenize " + m() + "--ids 999999999");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("outside the vocabulary"), std::string::npos) << r.err;
}

}  // namespace
