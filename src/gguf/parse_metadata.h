// Reading GGUF metadata (the key/value section) from a file's bytes, validating as it goes.
#pragma once
#include <cstdint>

#include "gguf/byte_reader.h"
#include "gguf/metadata.h"

namespace lode::gguf {

// Arrays nested deeper than this are refused (real files nest at most 2 deep).
inline constexpr int kMaxArrayNesting = 16;

// Reads n_kv key/value pairs into `out`, in file order; fails on duplicate keys, unknown value
// types, lengths or counts beyond the end of the file, and over-deep nesting.
void read_metadata(ByteReader& in, uint64_t n_kv, Metadata& out);

}  // namespace lode::gguf
