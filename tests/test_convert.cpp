// lode convert beyond the parity tests: the tokenizer.json a checkpoint carries becomes the
// tokenizer.ggml.* keys (padded to vocab_size), and bad checkpoints are refused clearly.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "gguf/reader.h"
#include "support/fixtures.h"
#include "test_gguf_helpers.h"

namespace {

namespace fs = std::filesystem;

// tiny_flat's checkpoint copied next to a small byte-level BPE tokenizer.json.
fs::path checkpoint_with_tokenizer(const lode::test::TempDir& tmp) {
  const auto fixture = lode::test::load_fixture("tiny_flat");
  const fs::path dir = tmp / "ckpt";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(fixture.checkpoint)) fs::copy(e.path(), dir / e.path().filename());
  std::ofstream(dir / "tokenizer.json") << R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": ["a b", ["ab", "b"]]},
    "added_tokens": [{"id": 500, "content": "<|endoftext|>", "special": true},
                     {"id": 501, "content": "<|im_end|>", "special": true},
                     {"id": 502, "content": "<tool>", "special": false}]})";
  return dir;
}

TEST(Convert, StoresTheCheckpointsTokenizerPaddedToTheVocabulary) {
  const lode::test::TempDir tmp;
  const fs::path out = tmp / "m.gguf";
  lode::model::convert_checkpoint(checkpoint_with_tokenizer(tmp), out, {});
  const lode::gguf::Reader model(out);
  const auto& m = model.metadata();
  const auto& tokens = m.get_array("tokenizer.ggml.tokens").strings();
  const auto& types = m.get_array("tokenizer.ggml.token_type").values<int32_t>();
  ASSERT_EQ(tokens.size(), 512u);  // the config's vocab_size
  EXPECT_EQ(tokens[2], "ab");
  EXPECT_EQ(types[2], 1);                // normal
  EXPECT_EQ(tokens[4], "[PAD4]");        // ids the tokenizer does not use
  EXPECT_EQ(types[4], 5);                // unused
  EXPECT_EQ(tokens[501], "<|im_end|>");
  EXPECT_EQ(types[501], 3);              // control (special)
  EXPECT_EQ(types[502], 4);              // user-defined (added, not special)
  EXPECT_EQ(m.get_array("tokenizer.ggml.merges").strings(), (std::vector<std::string>{"a b", "ab b"}));
  EXPECT_EQ(m.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(m.get_int64("tokenizer.ggml.eos_token_id"), 501);
  EXPECT_EQ(m.get_int64("tokenizer.ggml.padding_token_id"), 500);
}

TEST(Convert, RefusesCheckpointsThatAreNotQwen35Moe) {
  const lode::test::TempDir tmp;
  const fs::path dir = checkpoint_with_tokenizer(tmp);
  std::ofstream(dir / "config.json") << R"({"hidden_size": 64, "num_hidden_layers": 2})";
  try {
    lode::model::convert_checkpoint(dir, tmp / "x.gguf", {});
    FAIL() << "converted a config without num_attention_heads";
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp / "x.gguf"));
}

}  // namespace
