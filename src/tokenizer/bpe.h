// Byte-level BPE merges: a piece's bytes start as the 256 byte tokens, then adjacent pairs merge by
// rank (lowest first, leftmost among equals) until no listed merge applies — HF's algorithm.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lode::tokenizer {

class BpeMerges {
 public:
  // tokens: the vocabulary in the byte-level alphabet; merges: "left right" in rank order.
  // token_ids: text -> id for the same vocabulary (built once by the caller).
  BpeMerges(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
            const std::unordered_map<std::string_view, int32_t>& token_ids);

  // Appends the ids of one pre-tokenized piece (raw bytes).
  void encode_piece(std::string_view bytes, std::vector<int32_t>& out) const;

  // The id standing for one raw byte, or -1 when the vocabulary lacks its symbol.
  int32_t byte_token(uint8_t b) const { return byte_tokens_[b]; }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }
  const Merge* find(int32_t left, int32_t right) const;

  std::vector<int32_t> byte_tokens_;
  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace lode::tokenizer
