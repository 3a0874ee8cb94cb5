#include "tokenizer/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "core/utf8.h"

namespace lode::tokenizer {
namespace {

std::vector<TokenType> read_types(const gguf::Metadata& m, size_t n) {
  if (!m.contains("tokenizer.ggml.token_type")) return std::vector<TokenType>(n, TokenType::normal);
  const std::vector<int64_t> raw = m.get_integers("tokenizer.ggml.token_type");
  if (raw.size() != n)
    fail("tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}", raw.size(), n);
  std::vector<TokenType> types(n);
  for (size_t i = 0; i < n; ++i) {
    if (raw[i] < 1 || raw[i] > 6) fail("tokenizer.ggml.token_type[{}] = {} is not a GGUF token type (1..6)", i, raw[i]);
    types[i] = TokenType(raw[i]);
  }
  return types;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (uint8_t(c) & 0x80) == 0; });
}

// Canonical composition (NFC) of valid UTF-8.
std::string nfc(std::string_view text) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          utf8proc_ssize_t(text.size()), &out,
                                          utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) fail("NFC normalisation failed: {}", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<const char*>(out), size_t(n));
  std::free(out);
  return result;
}

}  // namespace

Tokenizer Tokenizer::from_metadata(const gguf::Metadata& m) {
  if (!m.contains("tokenizer.ggml.tokens"))
    fail("the model has no tokenizer (tokenizer.ggml.tokens is missing); use --tokens/--ids, or "
         "make the model with a tokenizer (lode convert with tokenizer.json, lode synth --tokenizer)");
  const std::string model = m.get_string_or("tokenizer.ggml.model", "gpt2");
  if (model != "gpt2")
    fail("tokenizer.ggml.model '{}' is not supported: lode reads byte-level BPE tokenizers (gpt2)", model);

  Tokenizer t;
  t.texts_ = m.get_strings("tokenizer.ggml.tokens");
  const size_t n = t.texts_.size();
  if (n == 0 || n > size_t(INT32_MAX)) fail("tokenizer.ggml.tokens has {} entries", n);
  t.types_ = read_types(m, n);
  t.ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) t.ids_.try_emplace(t.texts_[i], int32_t(i));

  t.bytes_.resize(n);
  t.added_by_first_byte_.resize(256);
  for (size_t i = 0; i < n; ++i) {
    const TokenType type = t.types_[i];
    const bool added = type == TokenType::control || type == TokenType::user_defined;
    std::optional<std::string> raw;
    if (!added) raw = bytes_of_symbols(t.texts_[i]);
    t.bytes_[i] = raw ? *raw : t.texts_[i];
    if (added && !t.texts_[i].empty()) t.added_by_first_byte_[uint8_t(t.texts_[i][0])].push_back(int32_t(i));
  }
  for (auto& ids : t.added_by_first_byte_)
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return t.texts_[size_t(a)].size() > t.texts_[size_t(b)].size();
    });

  const std::vector<std::string> merges =
      m.contains("tokenizer.ggml.merges") ? m.get_strings("tokenizer.ggml.merges") : std::vector<std::string>{};
  t.merges_ = std::make_unique<BpeMerges>(t.texts_, merges, t.ids_);
  t.pre_ = &pre_tokenizer_spec(m.get_string_or("tokenizer.ggml.pre", ""));
  t.splitter_ = std::make_unique<PreSplitter>(t.pre_->pattern);

  auto add_end = [&](std::optional<int32_t> id) {
    if (id && std::find(t.end_of_generation_.begin(), t.end_of_generation_.end(), *id) == t.end_of_generation_.end())
      t.end_of_generation_.push_back(*id);
  };
  if (m.contains("tokenizer.ggml.eos_token_id")) {
    const int64_t eos = m.get_int64("tokenizer.ggml.eos_token_id");
    if (eos < 0 || eos >= int64_t(n)) fail("tokenizer.ggml.eos_token_id {} is outside the {} tokens", eos, n);
    add_end(int32_t(eos));
  }
  add_end(t.find_token("<|im_end|>"));
  add_end(t.find_token("<|endoftext|>"));
  return t;
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  const auto it = ids_.find(text);
  return it == ids_.end() ? std::nullopt : std::optional<int32_t>(it->second);
}

Tokenizer::Match Tokenizer::next_added(std::string_view text, size_t from, bool allow_special,
                                       std::span<const TextSpan> plain, size_t* plain_at) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    if (plain_at)
      while (*plain_at < plain.size() && plain[*plain_at].end <= pos) ++*plain_at;
    for (int32_t id : added_by_first_byte_[uint8_t(text[pos])]) {
      const std::string& s = texts_[size_t(id)];
      if (types_[size_t(id)] == TokenType::control &&
          (!allow_special || (plain_at && *plain_at < plain.size() && plain[*plain_at].begin < pos + s.size())))
        continue;
      if (text.compare(pos, s.size(), s) == 0) return {pos, s.size(), id};
    }
  }
  return {};
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  return encode_added(text, allow_special, {});
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, std::span<const TextSpan> plain) const {
  return encode_added(text, /*allow_special=*/true, plain);
}

std::vector<int32_t> Tokenizer::encode_added(std::string_view text, bool allow_special,
                                             std::span<const TextSpan> plain) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  size_t pos = 0, plain_at = 0;
  while (pos < text.size()) {
    const Match m = next_added(text, pos, allow_special, plain, &plain_at);
    const size_t end = std::min(m.begin, text.size());
    encode_ordinary(text.substr(pos, end - pos), out);
    if (m.id < 0) break;
    out.push_back(m.id);
    pos = m.begin + m.length;
  }
  return out;
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  std::unordered_map<std::string, std::vector<int32_t>> cache;  // repeated words merge once
  size_t run = 0;  // start of the current run of valid UTF-8
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = utf8::valid_sequence_length(text, pos);
    if (len > 0) {
      pos += len;
      continue;
    }
    encode_valid_utf8(text.substr(run, pos - run), out, cache);
    const int32_t id = merges_->byte_token(uint8_t(text[pos]));
    if (id < 0) fail("the vocabulary has no token for byte 0x{:02x}", unsigned(uint8_t(text[pos])));
    out.push_back(id);
    run = ++pos;
  }
  encode_valid_utf8(text.substr(run), out, cache);
}

void Tokenizer::encode_valid_utf8(std::string_view text, std::vector<int32_t>& out,
                                  std::unordered_map<std::string, std::vector<int32_t>>& cache) const {
  if (text.empty()) return;
  std::string storage;
  std::vector<std::string_view> pieces;
  splitter_->split(normalized(text, storage), pieces);
  for (std::string_view piece : pieces) {
    auto [it, fresh] = cache.try_emplace(std::string(piece));
    if (fresh) merges_->encode_piece(piece, it->second);
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

std::string_view Tokenizer::normalized(std::string_view text, std::string& storage) const {
  if (!pre_->nfc || is_ascii(text)) return text;
  storage = nfc(text);
  return storage;
}

std::vector<std::string> Tokenizer::pieces(std::string_view text, bool allow_special) const {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < text.size();) {
    const Match m = next_added(text, pos, allow_special);
    const size_t end = std::min(m.begin, text.size());
    std::string storage;
    std::vector<std::string_view> views;
    splitter_->split(normalized(text.substr(pos, end - pos), storage), views);
    out.insert(out.end(), views.begin(), views.end());
    if (m.id < 0) break;
    out.push_back(texts_[size_t(m.id)]);
    pos = m.begin + m.length;
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  std::string text;
  for (int32_t id : ids) {
    if (id < 0 || id >= size()) fail("token id {} is outside the vocabulary of {} tokens", id, size());
    if (!render_special && types_[size_t(id)] == TokenType::control) continue;
    text += bytes_[size_t(id)];
  }
  return text;
}

std::string TextStream::push(int32_t id) {
  pending_ += tokenizer_.decode(std::span(&id, 1), render_special_);
  const size_t keep = utf8::incomplete_tail_length(pending_);
  std::string ready = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return ready;
}

std::string TextStream::flush() { return std::exchange(pending_, {}); }

}  // namespace lode::tokenizer
