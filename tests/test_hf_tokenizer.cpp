// tokenizer.json -> GGUF metadata: the pre-tokenizer family is recognised from the file's split
// regex (an unknown one is refused), and lode convert carries the checkpoint's chat template.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "core/error.h"
#include "gguf/reader.h"
#include "model/convert.h"
#include "support/fixtures.h"
#include "test_gguf_helpers.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/pre_split.h"

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json with_split(const std::string& regex) {
  json j;
  j["model"] = {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}};
  json split = {{"type", "Split"}, {"behavior", "Isolated"}};
  split["pattern"]["Regex"] = regex;
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({split, {{"type", "ByteLevel"}}})}};
  return j;
}

TEST(HfTokenizer, RecognisesTheFamilyByItsRegex) {
  for (const char* family : {"qwen35", "qwen2", "llama-bpe", "gpt2"})
    EXPECT_EQ(lode::tokenizer::hf_pre_tokenizer(
                  with_split(std::string(lode::tokenizer::pre_tokenizer_spec(family).pattern))),
              family);
  json byte_level_only = with_split("x");
  byte_level_only["pre_tokenizer"] = {{"type", "ByteLevel"}, {"use_regex", true}};
  EXPECT_EQ(lode::tokenizer::hf_pre_tokenizer(byte_level_only), "gpt2");
}

TEST(HfTokenizer, RefusesAnUnknownRegexNamingTheKnownFamilies) {
  try {
    lode::tokenizer::hf_pre_tokenizer(with_split(R"(\p{L}+|\s+)"));
    FAIL();
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen35"), std::string::npos) << e.what();
  }
}

TEST(HfTokenizer, ConvertStoresTheChatTemplate) {
  const lode::test::TempDir tmp;
  const auto fixture = lode::test::load_fixture("tiny_flat");
  const fs::path dir = tmp / "ckpt";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(fixture.checkpoint)) fs::copy(e.path(), dir / e.path().filename());
  std::ofstream(dir / "tokenizer.json") << with_split(std::string(lode::tokenizer::pre_tokenizer_spec("qwen35").pattern));
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "{{ messages }}"})";
  lode::model::convert_checkpoint(dir, tmp / "a.gguf", {});
  EXPECT_EQ(lode::gguf::Reader(tmp / "a.gguf").metadata().get_string("tokenizer.chat_template"), "{{ messages }}");
  EXPECT_EQ(lode::gguf::Reader(tmp / "a.gguf").metadata().get_string("tokenizer.ggml.pre"), "qwen35");
  std::ofstream(dir / "chat_template.jinja") << "{{ from_the_jinja_file }}";  // preferred, as in transformers
  lode::model::convert_checkpoint(dir, tmp / "b.gguf", {});
  EXPECT_EQ(lode::gguf::Reader(tmp / "b.gguf").metadata().get_string("tokenizer.chat_template"), "{{ from_the_jinja_file }}");
}

}  // namespace
