// lode convert beyond the parity tests: the tokenizer.json a checkpoint carries becomes the
// tokenizer.ggml.* keys (padded to vocab_size), and bad checkpoints are refused clearly.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "gguf/reader.h"
#include "support/fixtures.h"
#include "support/run_lode.h"
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

// Checkpoints that crashed convert or made it fail with an internal error are refused naming what is
// wrong: a config of 0 heads (a division by zero), config fields of the wrong JSON type, a token id
// that is negative (written out of bounds) or absurd, a safetensors shape whose bytes wrap 64 bits,
// a missing lm_head where the config does not tie it to the embedding (it was tied silently).
TEST(Convert, RefusesCheckpointsThatCrashedIt) {
  const lode::test::TempDir tmp;
  const fs::path dir = checkpoint_with_tokenizer(tmp);
  const std::string config = lode::test::slurp(dir / "config.json");
  const auto refused = [&](const std::string& what) {
    return lode::test::fails_with([&] { lode::model::convert_checkpoint(dir, tmp / "x.gguf", {}); }, {what});
  };
  const auto edit_config = [&](const std::string& from, const std::string& to) {
    std::string edited = config;
    const size_t at = edited.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    edited.replace(at, from.size(), to);
    std::ofstream(dir / "config.json") << edited;
  };
  ASSERT_NO_THROW(lode::model::convert_checkpoint(dir, tmp / "x.gguf", {}));
  edit_config("\"num_attention_heads\": 4", "\"num_attention_heads\": 0");
  EXPECT_TRUE(refused("'num_attention_heads' is 0"));
  edit_config("\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": \"small\"");
  EXPECT_TRUE(refused("'rms_norm_eps' is \"small\", not a number"));
  std::ofstream(dir / "config.json") << config;
  std::ofstream(dir / "tokenizer.json") << R"({"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}})";
  EXPECT_TRUE(refused("'a' has the id -1"));
  std::ofstream(dir / "tokenizer.json") << R"({"model": {"type": "BPE", "vocab": {"a": 1099511627776}, "merges": []}})";
  EXPECT_TRUE(refused("has the id 1099511627776"));
  fs::remove(dir / "tokenizer.json");
  ASSERT_NO_THROW(lode::model::convert_checkpoint(dir, tmp / "x.gguf", {}));
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors" || e.path().filename().string().ends_with(".index.json")) fs::remove(e.path());
  const std::string header = R"({"lm_head.weight": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
  std::ofstream(dir / "model.safetensors", std::ios::binary) << file << header;
  EXPECT_TRUE(refused("absurdly large"));
}

}  // namespace
