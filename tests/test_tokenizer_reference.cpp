// lode's tokenizer against the reference ids of tests/data/tokenizer (made by HF tokenizers' JS
// port from Qwen3's real tokenizer.json, cross-checked with HF tokenizers itself; see
// tools/tokenizer/README.md): every case, both pre-tokenizer families (qwen2 as shipped, qwen35),
// special tokens recognised or not; the pre-split pieces; and decoding back to the text.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>

#include "support/paths.h"
#include "support/qwen_tokenizer.h"

namespace {

using json = nlohmann::json;

json load(const char* name) {
  std::ifstream in(lode::test::test_data().string() + "/tokenizer/" + name);
  return json::parse(in);
}

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) bytes += char(std::stoi(hex.substr(i, 2), nullptr, 16));
  return bytes;
}

struct Case {
  std::string name, text;
  json reference;
};

std::vector<Case> cases() {
  const json corpus = load("corpus.json"), reference = load("reference.json");
  const auto& c = corpus["cases"];
  const auto& r = reference["cases"];
  EXPECT_EQ(c.size(), r.size());
  std::vector<Case> out;
  for (size_t i = 0; i < std::min(c.size(), r.size()); ++i) {
    EXPECT_EQ(c[i]["name"], r[i]["name"]);
    out.push_back({c[i]["name"], c[i].contains("hex") ? from_hex(c[i]["hex"]) : c[i]["text"].get<std::string>(), r[i]});
  }
  return out;
}

class TokenizerReference : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerReference, IdenticalIdsOnEveryCaseWithAndWithoutSpecialTokens) {
  LODE_REQUIRE_QWEN3_TOKENIZER();
  const auto& tok = lode::test::qwen3_tokenizer(GetParam());
  int checked = 0;
  for (const Case& c : cases()) {
    for (const char* mode : {"special", "plain"}) {
      const auto expect = c.reference[GetParam()][mode].get<std::vector<int32_t>>();
      const auto got = tok.encode(c.text, std::string(mode) == "special");
      EXPECT_EQ(got, expect) << c.name << " (" << mode << ")";
      ++checked;
    }
  }
  EXPECT_GE(checked, 200);
}

TEST_P(TokenizerReference, IdenticalPreSplitPieces) {
  LODE_REQUIRE_QWEN3_TOKENIZER();
  const auto& tok = lode::test::qwen3_tokenizer(GetParam());
  int checked = 0;
  for (const Case& c : cases()) {
    if (!c.reference.contains("pieces")) continue;
    EXPECT_EQ(tok.pieces(c.text, true), c.reference["pieces"][GetParam()].get<std::vector<std::string>>()) << c.name;
    ++checked;
  }
  EXPECT_GE(checked, 90);
}

TEST_P(TokenizerReference, DecodesBackToTheNormalisedText) {
  LODE_REQUIRE_QWEN3_TOKENIZER();
  const auto& tok = lode::test::qwen3_tokenizer(GetParam());
  for (const Case& c : cases()) {
    // Invalid UTF-8 comes back byte for byte; valid text comes back NFC-normalised.
    const std::string expect = c.reference.value("nfc", c.text);
    EXPECT_EQ(tok.decode(c.reference[GetParam()]["special"].get<std::vector<int32_t>>()), expect) << c.name;
    EXPECT_EQ(tok.decode(tok.encode(c.text, true)), expect) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerReference, ::testing::Values("qwen2", "qwen35"));

TEST(TokenizerReferenceData, FamiliesReallyDifferOnCombiningMarks) {
  // Guards the data itself: a reference that made no difference between the regexes would not
  // test the qwen35 pattern at all.
  int differ = 0;
  for (const Case& c : cases()) differ += c.reference["qwen2"]["special"] != c.reference["qwen35"]["special"];
  EXPECT_GE(differ, 3);
}

}  // namespace
