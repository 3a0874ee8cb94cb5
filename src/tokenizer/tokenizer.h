// Text <-> token ids for byte-level BPE models (tokenizer.ggml.model = gpt2), read from GGUF
// metadata. Encoding: added tokens are cut out of the raw text first (control tokens only when the
// caller allows special tokens), the rest is NFC-normalised where the family asks for it, pre-split
// by the family's regex, and merged by BPE. Invalid UTF-8 bytes are kept: each becomes its byte
// token, so decode(encode(bytes)) gives the same bytes back.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/text_span.h"
#include "gguf/metadata.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_split.h"

namespace lode::tokenizer {

// GGUF's tokenizer.ggml.token_type values.
enum class TokenType : int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

class Tokenizer {
 public:
  static Tokenizer from_metadata(const gguf::Metadata& metadata);

  // allow_special: control tokens (<|im_start|>, <|im_end|>...) written in the text become their
  // ids; otherwise they are ordinary text. User-defined added tokens (<think>) are always matched.
  std::vector<int32_t> encode(std::string_view text, bool allow_special) const;
  // The same with control tokens read only outside `plain` (spans in order, not overlapping): text
  // inside is ordinary even where it spells a control token (a chat's client text,
  // chat::RenderedChat). The pre-split and merges run over the whole text as they would anyway.
  std::vector<int32_t> encode(std::string_view text, std::span<const TextSpan> plain) const;

  // The pieces BPE works on, as text: added tokens whole, the text between them normalised and
  // pre-split. For valid UTF-8 (a debugging and testing view of encode()).
  std::vector<std::string> pieces(std::string_view text, bool allow_special) const;

  // render_special false drops control tokens from the text.
  std::string decode(std::span<const int32_t> ids, bool render_special = true) const;

  // The raw bytes a token stands for (control tokens: their text).
  const std::string& token_bytes(int32_t id) const { return bytes_.at(size_t(id)); }
  TokenType type(int32_t id) const { return types_.at(size_t(id)); }
  int64_t size() const { return int64_t(bytes_.size()); }
  std::optional<int32_t> find_token(std::string_view text) const;
  std::string_view pre_name() const { return pre_->name; }

  // Tokens that end a generation: the file's eos plus <|im_end|> / <|endoftext|> when present.
  const std::vector<int32_t>& end_of_generation() const { return end_of_generation_; }

 private:
  Tokenizer() = default;
  struct Match {
    size_t begin = std::string_view::npos;
    size_t length = 0;
    int32_t id = -1;
  };
  // The next added token at or after `from`; control tokens only where allowed and not overlapping
  // `plain` (*plain_at: the first of them that may still matter, advanced as the text is read).
  Match next_added(std::string_view text, size_t from, bool allow_special, std::span<const TextSpan> plain = {},
                   size_t* plain_at = nullptr) const;
  std::vector<int32_t> encode_added(std::string_view text, bool allow_special, std::span<const TextSpan> plain) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
  // `text` NFC-normalised when the family asks for it (into `storage` when it changes).
  std::string_view normalized(std::string_view text, std::string& storage) const;
  void encode_valid_utf8(std::string_view text, std::vector<int32_t>& out,
                         std::unordered_map<std::string, std::vector<int32_t>>& cache) const;

  std::vector<std::string> texts_;  // as stored (byte-level alphabet for normal tokens)
  std::vector<std::string> bytes_;  // what each token stands for
  std::vector<TokenType> types_;
  std::unordered_map<std::string_view, int32_t> ids_;  // keys view texts_
  std::unique_ptr<BpeMerges> merges_;
  const PreTokenizerSpec* pre_ = nullptr;
  std::unique_ptr<PreSplitter> splitter_;
  // Added tokens by first byte, longest first: [byte] -> ids.
  std::vector<std::vector<int32_t>> added_by_first_byte_;
  std::vector<int32_t> end_of_generation_;
};

// Turns a stream of token ids into text without ever splitting a UTF-8 character: bytes of an
// unfinished character wait for the next token; flush() releases whatever is left at the end.
class TextStream {
 public:
  explicit TextStream(const Tokenizer& tokenizer, bool render_special = true)
      : tokenizer_(tokenizer), render_special_(render_special) {}
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool render_special_;
  std::string pending_;
};

}  // namespace lode::tokenizer
