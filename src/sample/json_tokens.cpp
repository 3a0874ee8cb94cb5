#include "sample/json_tokens.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace lode::sample {

JsonTokens::JsonTokens(std::vector<std::string_view> bytes, const std::vector<bool>& excluded)
    : bytes_(std::move(bytes)), string_safe_(bytes_.size(), 0) {
  if (excluded.size() != bytes_.size())
    fail("json tokens: {} exclusion flags for {} tokens", excluded.size(), bytes_.size());
  std::vector<int32_t> usable, unsafe;
  for (size_t id = 0; id < bytes_.size(); ++id) {
    const std::string_view b = bytes_[id];
    if (excluded[id] || b.empty()) continue;
    usable.push_back(int32_t(id));
    longest_ = std::max(longest_, b.size());
    string_safe_[id] = std::all_of(b.begin(), b.end(), [](char c) {
      return c != '"' && c != '\\' && static_cast<unsigned char>(c) >= 0x20;
    });
    if (!string_safe_[id]) unsafe.push_back(int32_t(id));
  }
  usable_ = order_of(std::move(usable));
  string_unsafe_ = order_of(std::move(unsafe));
}

JsonTokens::Order JsonTokens::order_of(std::vector<int32_t> ids) const {
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return bytes_[size_t(a)] < bytes_[size_t(b)]; });
  Order order{.ids = std::move(ids), .shared = {}};
  order.shared.assign(order.ids.size(), 0);
  for (size_t k = 1; k < order.ids.size(); ++k) {
    const std::string_view a = bytes_[size_t(order.ids[k - 1])], b = bytes_[size_t(order.ids[k])];
    order.shared[k] = uint32_t(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
  }
  return order;
}

template <class State>
void JsonTokens::mark(const State& state, std::vector<uint8_t>& allowed) const {
  if (state.in_string()) {  // the string-safe tokens leave it in the string: taken untried
    allowed = string_safe_;
    walk(string_unsafe_, state, allowed);
  } else {
    allowed.assign(bytes_.size(), 0);
    walk(usable_, state, allowed);
  }
}

// Tries the tokens of `order` in turn, each from the state after the bytes it shares with the
// last token tried, passing over those whose bytes begin with a refused prefix.
template <class State>
void JsonTokens::walk(const Order& order, const State& state, std::vector<uint8_t>& allowed) const {
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  std::vector<State> after(longest_ + 1, state);  // after[d]: the state after d bytes of the last token tried (d <= valid)
  after[0] = state;
  size_t valid = 0, refused = kNone;  // the last token tried was refused at its byte `refused` - 1
  size_t shared = 0;                  // bytes this token shares with the last one tried
  for (size_t k = 0; k < order.ids.size(); ++k) {
    shared = std::min(shared, size_t(order.shared[k]));
    if (refused <= shared) continue;
    const size_t id = size_t(order.ids[k]);
    const std::string_view b = bytes_[id];
    size_t d = std::min(shared, valid);
    refused = kNone;
    for (; d < b.size(); ++d) {
      after[d + 1] = after[d];
      if (!after[d + 1].push(b.substr(d, 1))) {  // (the byte alone: a refused state is dropped, not restored)
        refused = d + 1;
        break;
      }
    }
    valid = d;
    shared = kNone;
    allowed[id] = refused == kNone;
  }
}

template void JsonTokens::mark(const JsonPrefix&, std::vector<uint8_t>&) const;
template void JsonTokens::mark(const SchemaPrefix&, std::vector<uint8_t>&) const;

}  // namespace lode::sample
