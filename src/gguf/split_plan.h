// Deciding which tensors go into which file when a model is split by a maximum file size.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace lode::gguf {

struct PlannedTensor {
  uint64_t info_bytes;  // its tensor info in the header
  uint64_t data_bytes;  // its data, before alignment padding
};

// Groups tensors, in order, into files of at most max_file_bytes each (header, padding and data
// counted), the first file's header carrying first_header_bytes of fixed header and metadata and
// every later one other_header_bytes. A file always takes at least one tensor, so a tensor larger
// than the limit gets a file of its own; max_file_bytes == 0 means one file. Returns the index
// ranges [begin, end) of each file; with no tensors, one empty file.
struct FileRange {
  size_t begin;
  size_t end;
};
std::vector<FileRange> plan_split(const std::vector<PlannedTensor>& tensors,
                                  uint64_t first_header_bytes, uint64_t other_header_bytes,
                                  uint64_t alignment, uint64_t max_file_bytes);

}  // namespace lode::gguf
