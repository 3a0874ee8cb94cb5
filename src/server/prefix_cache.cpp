#include "server/prefix_cache.h"

#include <algorithm>

namespace lode::server {

PrefixCache::PrefixCache(int64_t interval, size_t max_checkpoints)
    : interval_(std::max<int64_t>(1, interval)), max_checkpoints_(max_checkpoints) {}

int64_t PrefixCache::bytes() const {
  int64_t total = 0;
  for (const auto& [position, cp] : checkpoints_) total += cp.bytes();
  return total;
}

void PrefixCache::clear() {
  tokens_.clear();
  checkpoints_.clear();
}

void PrefixCache::take_checkpoint(const cpu::Session& session) {
  if (max_checkpoints_ == 0) return;
  checkpoints_[session.position()] = session.checkpoint();
  while (checkpoints_.size() > max_checkpoints_) checkpoints_.erase(checkpoints_.begin());
}

PrefixCache::Start PrefixCache::prepare(cpu::Session& session, std::span<const int32_t> prompt) {
  Start start;
  if (session.position() != int64_t(tokens_.size())) clear();  // someone else used the session
  // The shared prefix, leaving at least the prompt's last token to be run again.
  const auto limit = std::min(tokens_.size(), prompt.size() - std::min<size_t>(prompt.size(), 1));
  const size_t shared = size_t(std::mismatch(tokens_.begin(), tokens_.begin() + ptrdiff_t(limit), prompt.begin()).first -
                               tokens_.begin());
  auto usable = checkpoints_.upper_bound(int64_t(shared));  // first checkpoint past the shared part
  if (usable != checkpoints_.begin() && std::prev(usable)->first > 0) {
    const auto& [position, cp] = *std::prev(usable);
    session.rewind(cp);
    start.cached = position;
    checkpoints_.erase(usable, checkpoints_.end());
    tokens_.resize(size_t(position));
  } else {
    session.reset();
    clear();
  }
  // Whole intervals of the rest, each followed by a checkpoint; generation prefills the remainder.
  int64_t at = start.cached;
  const int64_t last_whole = (int64_t(prompt.size()) - 1) / interval_ * interval_;
  while (at + interval_ <= last_whole) {
    session.prefill(prompt.subspan(size_t(at), size_t(interval_)), interval_);
    tokens_.insert(tokens_.end(), prompt.begin() + at, prompt.begin() + at + interval_);
    at += interval_;
    take_checkpoint(session);
  }
  tokens_.insert(tokens_.end(), prompt.begin() + at, prompt.end());  // generation prefills these
  start.prefilled = at;
  return start;
}

void PrefixCache::record(std::span<const int32_t> generated, bool last_pending) {
  const size_t in_session = generated.size() - (last_pending && !generated.empty() ? 1 : 0);
  tokens_.insert(tokens_.end(), generated.begin(), generated.begin() + ptrdiff_t(in_session));
}

}  // namespace lode::server
