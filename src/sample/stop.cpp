#include "sample/stop.h"

#include <algorithm>

#include "core/error.h"

namespace lode::sample {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (size_t i = 0; i < stops_.size(); ++i) {
    if (stops_[i].empty())
      fail("stop string {} of {} is empty; remove it (an empty stop would end generation at once)",
           i + 1, stops_.size());
    longest_stop_ = std::max(longest_stop_, stops_[i].size());
  }
}

StopMatcher::Result StopMatcher::push(std::string_view text) {
  if (stopped_) return {"", true, matched_};
  held_.append(text);

  // Earliest end, then earliest start. Every match lies inside held_: the bytes before a match's
  // start were released only if no suffix starting there could become a stop.
  size_t best_start = std::string::npos, best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& stop : stops_) {
    const size_t start = held_.find(stop);
    if (start == std::string::npos) continue;
    const size_t end = start + stop.size();
    if (!best || end < best_end || (end == best_end && start < best_start)) {
      best = &stop;
      best_start = start;
      best_end = end;
    }
  }
  if (best) {
    stopped_ = true;
    matched_ = *best;
    Result result{held_.substr(0, best_start), true, matched_};
    held_.clear();
    return result;
  }

  const size_t keep = longest_partial_suffix();
  Result result{held_.substr(0, held_.size() - keep), false, ""};
  held_.erase(0, held_.size() - keep);
  return result;
}

StopMatcher::Result StopMatcher::push_opaque(std::string_view text) {
  if (stopped_) return {"", true, matched_};
  Result r;
  r.emit.swap(held_);
  r.emit.append(text);
  return r;
}

std::string StopMatcher::flush() {
  std::string rest;
  rest.swap(held_);
  return stopped_ ? std::string() : rest;
}

size_t StopMatcher::longest_partial_suffix() const {
  const size_t most = std::min(held_.size(), longest_stop_ == 0 ? 0 : longest_stop_ - 1);
  const std::string_view held(held_);
  for (size_t length = most; length > 0; --length) {
    const std::string_view suffix = held.substr(held.size() - length);
    for (const std::string& stop : stops_)
      if (stop.size() > length && std::string_view(stop).starts_with(suffix)) return length;
  }
  return 0;
}

}  // namespace lode::sample
