#include "gguf/split_plan.h"

#include "gguf/tensor_shape.h"

namespace lode::gguf {

std::vector<FileRange> plan_split(const std::vector<PlannedTensor>& tensors,
                                  uint64_t first_header_bytes, uint64_t other_header_bytes,
                                  uint64_t alignment, uint64_t max_file_bytes) {
  if (max_file_bytes == 0) return {{0, tensors.size()}};
  std::vector<FileRange> files;
  size_t begin = 0;
  uint64_t header = first_header_bytes;  // fixed header + metadata + tensor infos so far
  uint64_t data = 0;                     // aligned tensor data so far
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t new_header = header + tensors[i].info_bytes;
    const uint64_t new_data = data + align_up(tensors[i].data_bytes, alignment);
    const bool fits = align_up(new_header, alignment) + new_data <= max_file_bytes;
    if (!fits && i > begin) {
      files.push_back({begin, i});
      begin = i;
      header = other_header_bytes + tensors[i].info_bytes;
      data = align_up(tensors[i].data_bytes, alignment);
    } else {
      header = new_header;
      data = new_data;
    }
  }
  files.push_back({begin, tensors.size()});
  return files;
}

}  // namespace lode::gguf
