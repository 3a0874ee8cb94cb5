// The size rules every GGUF tensor follows, shared by the reader (checking files) and the writer
// (checking what it is asked to write).
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "core/quant/types.h"

namespace lode::gguf {

// Bytes of a tensor of this type and shape (ne in ggml order). Fails with a lode::Error saying
// what is wrong (without naming the tensor: callers add that) when there are not 1 to 4
// dimensions, a dimension is not positive, the element count or byte size overflows 64 bits, or
// ne[0] is not a whole number of the type's blocks.
uint64_t tensor_bytes(const TypeTraits& type, std::span<const int64_t> ne);

// "[4096, 151936]"
std::string shape_string(std::span<const int64_t> ne);

// x rounded up to a multiple of `alignment` (a power of two); fails when that overflows.
uint64_t align_up(uint64_t x, uint64_t alignment);

inline bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace lode::gguf
