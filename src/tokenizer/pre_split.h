// Pre-tokenization: the regex that cuts text into the pieces BPE merges within, one per
// `tokenizer.ggml.pre` family, run with PCRE2's JIT (Unicode classes such as \p{L} are required).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lode::tokenizer {

struct PreTokenizerSpec {
  std::string_view name;     // the tokenizer.ggml.pre value
  std::string_view pattern;  // the split regex (HF "Split" with behaviour "Isolated")
  bool nfc;                  // the HF tokenizer normalises to NFC before splitting
};

// The spec for a tokenizer.ggml.pre value; fails naming the supported ones when unknown.
const PreTokenizerSpec& pre_tokenizer_spec(std::string_view pre);
std::string supported_pre_tokenizers();  // "qwen35, qwen2, ..." for messages

class PreSplitter {
 public:
  explicit PreSplitter(std::string_view pattern);
  ~PreSplitter();
  PreSplitter(const PreSplitter&) = delete;
  PreSplitter& operator=(const PreSplitter&) = delete;

  // Appends the pieces of `text` (valid UTF-8) to `pieces`: every regex match, and any text between
  // matches, in order; together they cover the text exactly. Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace lode::tokenizer
