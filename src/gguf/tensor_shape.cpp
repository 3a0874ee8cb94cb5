#include "gguf/tensor_shape.h"

#include <limits>

#include "core/error.h"
#include "gguf/reader.h"

namespace lode::gguf {

uint64_t tensor_bytes(const TypeTraits& type, std::span<const int64_t> ne) {
  if (ne.empty() || ne.size() > size_t(kMaxDims))
    fail("a tensor has {} dimensions; GGUF tensors have 1 to {}", ne.size(), kMaxDims);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t elements = 1;
  for (size_t i = 0; i < ne.size(); ++i) {
    if (ne[i] <= 0)
      fail("dimension {} of shape {} is {}; every dimension must be positive", i,
           shape_string(ne), ne[i]);
    if (elements > kMax / ne[i]) fail("shape {} has more than 2^63 elements", shape_string(ne));
    elements *= ne[i];
  }
  if (ne[0] % type.block_size != 0)
    fail("rows of {} values are not whole {} blocks of {} values (shape {})", ne[0], type.name,
         type.block_size, shape_string(ne));
  constexpr uint64_t kMaxBytes = std::numeric_limits<uint64_t>::max();
  const uint64_t blocks_per_row = uint64_t(ne[0] / type.block_size);
  const uint64_t rows = uint64_t(elements / ne[0]);
  if (blocks_per_row > kMaxBytes / type.block_bytes)
    fail("shape {} of {} takes more than 2^64 bytes", shape_string(ne), type.name);
  const uint64_t row = blocks_per_row * type.block_bytes;
  if (rows > kMaxBytes / row)
    fail("shape {} of {} takes more than 2^64 bytes", shape_string(ne), type.name);
  return row * rows;
}

std::string shape_string(std::span<const int64_t> ne) {
  std::string out = "[";
  for (size_t i = 0; i < ne.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", ne[i]);
  return out + "]";
}

uint64_t align_up(uint64_t x, uint64_t alignment) {
  const uint64_t rounded = (x + alignment - 1) & ~(alignment - 1);
  if (rounded < x) fail("offset {} overflows when aligned to {} bytes", x, alignment);
  return rounded;
}

}  // namespace lode::gguf
