#include "tokenizer/bpe.h"

#include <queue>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace lode::tokenizer {

BpeMerges::BpeMerges(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
                     const std::unordered_map<std::string_view, int32_t>& token_ids)
    : byte_tokens_(256, -1) {
  for (int b = 0; b < 256; ++b)
    if (auto it = token_ids.find(byte_symbols()[size_t(b)]); it != token_ids.end()) byte_tokens_[size_t(b)] = it->second;

  merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& m = merges[rank];
    const size_t space = m.find(' ', 1);  // byte-level tokens never hold a space (it is spelled Ġ)
    if (space == std::string::npos || space + 1 >= m.size())
      fail("tokenizer.ggml.merges[{}] '{}' is not two tokens separated by a space", rank, m);
    const std::string_view left(m.data(), space), right(m.data() + space + 1, m.size() - space - 1);
    joined.assign(left).append(right);
    const auto l = token_ids.find(left), r = token_ids.find(right), j = token_ids.find(joined);
    if (l == token_ids.end() || r == token_ids.end() || j == token_ids.end())
      fail("tokenizer.ggml.merges[{}] '{}' names a token missing from tokenizer.ggml.tokens; the "
           "file's tokenizer is inconsistent (re-convert it)", rank, m);
    merges_.try_emplace(pair_key(l->second, r->second), Merge{int32_t(rank), j->second});
  }
}

const BpeMerges::Merge* BpeMerges::find(int32_t left, int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeMerges::encode_piece(std::string_view bytes, std::vector<int32_t>& out) const {
  const int n = int(bytes.size());
  const auto count = static_cast<size_t>(n);
  std::vector<int32_t> id(count), prev(count), next(count);
  for (int i = 0; i < n; ++i) {
    id[size_t(i)] = byte_tokens_[uint8_t(bytes[size_t(i)])];
    if (id[size_t(i)] < 0)
      fail("the vocabulary has no token for byte 0x{:02x}, so this text cannot be tokenized",
           unsigned(uint8_t(bytes[size_t(i)])));
    prev[size_t(i)] = i - 1;
    next[size_t(i)] = i + 1 < n ? i + 1 : -1;
  }
  if (n == 1) {
    out.push_back(id[0]);
    return;
  }

  // Candidate merges ordered by (rank, position); a candidate is stale once either side changed.
  struct Candidate {
    int32_t rank, left, right_pos, left_id, right_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int left) {
    if (left < 0) return;
    const int right = next[size_t(left)];
    if (right < 0) return;
    if (const Merge* m = find(id[size_t(left)], id[size_t(right)]))
      queue.push({m->rank, left, right, id[size_t(left)], id[size_t(right)]});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);

  std::vector<bool> alive(count, true);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    const auto l = size_t(c.left), r = size_t(c.right_pos);
    if (!alive[l] || !alive[r] || next[l] != c.right_pos || id[l] != c.left_id || id[r] != c.right_id)
      continue;
    id[l] = find(c.left_id, c.right_id)->result;
    alive[r] = false;
    next[l] = next[r];
    if (next[l] >= 0) prev[size_t(next[l])] = c.left;
    consider(prev[l]);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = next[size_t(i)]) out.push_back(id[size_t(i)]);
}

}  // namespace lode::tokenizer
