// A range of bytes [begin, end) of a text.
#pragma once
#include <cstddef>

namespace lode {

struct TextSpan {
  std::size_t begin = 0, end = 0;
};

}  // namespace lode
