// Which tokens of a vocabulary keep a text the beginning of a JSON object (sample/json_prefix.h),
// or of one a schema accepts (sample/json_schema.h): the mask of a reply constrained to JSON, at
// every step. Trying every token's bytes from the
// state would cost milliseconds a step on a 248,320-token vocabulary. Here the tokens are walked
// in the order of their bytes, each tried from the state its shared prefix with the last one tried
// left, and every token that shares a refused prefix is passed over; inside a string, where most
// JSON text is, a token without a quote, backslash or control byte is taken untried.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "sample/json_prefix.h"
#include "sample/json_schema.h"

namespace lode::sample {

class JsonTokens {
 public:
  // bytes[id]: token id's bytes (they must outlive this); excluded[id]: never JSON text (control
  // and added tokens, whose bytes are markup).
  JsonTokens(std::vector<std::string_view> bytes, const std::vector<bool>& excluded);
  // allowed[id] = whether token id's bytes keep `state` a beginning it takes (false for excluded
  // and empty tokens); `allowed` is resized to the vocabulary. State: JsonPrefix or SchemaPrefix.
  template <class State>
  void mark(const State& state, std::vector<uint8_t>& allowed) const;

 private:
  // Tokens in the order of their bytes, and how many bytes each shares with the one before.
  struct Order {
    std::vector<int32_t> ids;
    std::vector<uint32_t> shared;
  };
  Order order_of(std::vector<int32_t> ids) const;
  template <class State>
  void walk(const Order& order, const State& state, std::vector<uint8_t>& allowed) const;

  std::vector<std::string_view> bytes_;
  Order usable_;                      // every token not excluded and not empty
  Order string_unsafe_;               // of them, those with a quote, backslash or control byte
  std::vector<uint8_t> string_safe_;  // per id: usable, and none of those bytes
  size_t longest_ = 0;
};

}  // namespace lode::sample
