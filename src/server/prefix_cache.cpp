#include "server/prefix_cache.h"

#include <algorithm>

namespace lode::server {

PrefixCache::PrefixCache(PromptCuts cuts, size_t max_checkpoints) : cuts_(cuts), max_checkpoints_(max_checkpoints) {}

int64_t PrefixCache::bytes(std::unordered_set<const engine::Checkpoint*>& seen) const {
  int64_t total = 0;
  for (const auto& [position, cp] : checkpoints_)
    if (seen.insert(cp.get()).second) total += cp->bytes();
  return total;
}

void PrefixCache::clear() {
  tokens_.clear();
  checkpoints_.clear();
}

bool PrefixCache::drop_oldest() {
  if (checkpoints_.empty()) return false;
  checkpoints_.erase(checkpoints_.begin());
  return true;
}

std::map<int64_t, std::shared_ptr<const engine::Checkpoint>>::const_iterator PrefixCache::usable(
    const engine::Sequence& sequence, std::span<const int32_t> prompt, bool generating) const {
  const int64_t held = int64_t(tokens_.size());
  if (generating ? sequence.position() < held : sequence.position() != held) return checkpoints_.end();  // moved
  // The shared prefix, leaving at least the prompt's last token to be run again.
  const auto limit = std::min(tokens_.size(), prompt.size() - std::min<size_t>(prompt.size(), 1));
  const size_t shared = size_t(std::mismatch(tokens_.begin(), tokens_.begin() + ptrdiff_t(limit), prompt.begin()).first -
                               tokens_.begin());
  // The last checkpoint inside the shared part where a cold run of the prompt cuts it too.
  for (auto it = checkpoints_.upper_bound(int64_t(shared)); it != checkpoints_.begin();) {
    --it;
    if (it->first > 0 && cuts_.is_cut(prompt, it->first)) return it;
  }
  return checkpoints_.end();
}

int64_t PrefixCache::reusable(const engine::Sequence& sequence, std::span<const int32_t> prompt, bool generating) const {
  const auto it = usable(sequence, prompt, generating);
  return it == checkpoints_.end() ? 0 : it->first;
}

int64_t PrefixCache::resume(engine::Sequence& sequence, std::span<const int32_t> prompt) {
  const auto it = usable(sequence, prompt, false);
  if (it == checkpoints_.end()) {
    sequence.reset();
    clear();
    return 0;
  }
  const int64_t position = it->first;
  sequence.rewind(*it->second);
  checkpoints_.erase(std::next(it), checkpoints_.end());
  tokens_.resize(size_t(position));
  return position;
}

int64_t PrefixCache::resume_from(engine::Sequence& sequence, const PrefixCache& source, const engine::Sequence& source_sequence,
                                 std::span<const int32_t> prompt, bool source_generating) {
  const auto it = source.usable(source_sequence, prompt, source_generating);
  if (it == source.checkpoints_.end()) return resume(sequence, prompt);
  sequence.copy_prefix(source_sequence, *it->second);
  tokens_.assign(source.tokens_.begin(), source.tokens_.begin() + ptrdiff_t(it->first));
  checkpoints_ = std::map<int64_t, std::shared_ptr<const engine::Checkpoint>>(source.checkpoints_.begin(), std::next(it));
  bound();
  return it->first;
}

void PrefixCache::after_chunk(const engine::Sequence& sequence, std::span<const int32_t> chunk, bool checkpoint) {
  tokens_.insert(tokens_.end(), chunk.begin(), chunk.end());
  if (!checkpoint || max_checkpoints_ == 0) return;
  checkpoints_[sequence.position()] = sequence.checkpoint();
  bound();
}

void PrefixCache::bound() {
  while (checkpoints_.size() > max_checkpoints_) {
    auto drop = checkpoints_.begin();
    if (max_checkpoints_ >= 2 && drop->first % cuts_.step != 0) ++drop;  // the first turn's end stays
    checkpoints_.erase(drop);
  }
}

void PrefixCache::record(std::span<const int32_t> generated, bool last_pending) {
  const size_t in_session = generated.size() - (last_pending && !generated.empty() ? 1 : 0);
  tokens_.insert(tokens_.end(), generated.begin(), generated.begin() + ptrdiff_t(in_session));
}

}  // namespace lode::server
