#include "gguf/parse_tensors.h"

#include <algorithm>
#include <numeric>
#include <unordered_set>

#include "gguf/tensor_shape.h"

namespace lode::gguf {
namespace {

// The fewest bytes a tensor info can take: name length + one byte of name, n_dims, one
// dimension, type, offset.
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;

TensorInfo read_tensor_info(ByteReader& in) {
  const uint64_t info_at = in.offset();
  TensorInfo t;
  t.name = in.read_string("a tensor name");
  if (t.name.empty()) in.fail_at(info_at, "a tensor has an empty name");
  const uint64_t dims_at = in.offset();
  const uint32_t n_dims = in.read<uint32_t>("a tensor's dimension count");
  if (n_dims == 0 || n_dims > uint32_t(kMaxDims))
    in.fail_at(dims_at, "tensor '{}' has {} dimensions; GGUF tensors have 1 to {}",
               shown(t.name), n_dims, kMaxDims);
  t.n_dims = int(n_dims);
  for (int i = 0; i < t.n_dims; ++i) t.ne[size_t(i)] = in.read<int64_t>("a tensor dimension");
  const uint64_t type_at = in.offset();
  const uint32_t type_id = in.read<uint32_t>("a tensor's ggml type");
  t.type = find_type(type_id);
  if (!t.type)
    in.fail_at(type_at, "tensor '{}' has ggml type id {}, which ggml does not define (or no longer "
               "supports)", shown(t.name), type_id);
  t.offset = in.read<uint64_t>("a tensor's data offset");
  try {
    t.size = tensor_bytes(*t.type, std::span(t.ne.data(), size_t(t.n_dims)));
  } catch (const Error& e) {
    in.fail_at(info_at, "tensor '{}': {}", shown(t.name), e.what());
  }
  return t;
}

}  // namespace

std::vector<TensorInfo> read_tensor_infos(ByteReader& in, uint64_t n_tensors) {
  in.check_count(n_tensors, kMinTensorInfoBytes, 8, "the tensor count");
  std::vector<TensorInfo> tensors;
  tensors.reserve(size_t(n_tensors));  // bounded by the file size just above
  std::unordered_set<std::string_view> names;
  names.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t info_at = in.offset();
    tensors.push_back(read_tensor_info(in));
    // string_views stay valid: the vector never reallocates after reserve().
    if (!names.insert(tensors.back().name).second)
      in.fail_at(info_at, "tensor name '{}' appears twice", shown(tensors.back().name));
  }
  return tensors;
}

void place_tensor_data(std::vector<TensorInfo>& tensors, std::span<const uint8_t> file,
                       uint64_t data_offset, uint32_t alignment, const std::string& file_name) {
  const uint64_t data_bytes = data_offset <= file.size() ? file.size() - data_offset : 0;
  for (TensorInfo& t : tensors) {
    if (t.offset % alignment != 0)
      fail("{}: tensor '{}': data offset {} is not a multiple of the alignment {}", file_name,
           shown(t.name), t.offset, alignment);
    if (t.offset > data_bytes)
      fail("{}: tensor '{}': its data offset {} lies beyond the end of the file ({} bytes): "
           "truncated file?", file_name, shown(t.name), t.offset, file.size());
    if (t.size > data_bytes - t.offset)
      fail("{}: tensor '{}': its {} bytes at data offset {} (file byte {}) run past the end of the "
           "file ({} bytes): truncated file?", file_name, shown(t.name), t.size, t.offset,
           data_offset + t.offset, file.size());
    t.data = file.data() + data_offset + t.offset;
  }
  // Overlapping tensors mean a damaged offset: check neighbours in offset order.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& before = tensors[order[i - 1]];
    const TensorInfo& after = tensors[order[i]];
    if (before.offset + before.size > after.offset)
      fail("{}: tensor '{}' (data offset {}, {} bytes) overlaps tensor '{}' (data offset {})",
           file_name, shown(before.name), before.offset, before.size, shown(after.name),
           after.offset);
  }
}

}  // namespace lode::gguf
