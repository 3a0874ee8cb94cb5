#include "gguf/reader.h"

#include "core/error.h"
#include "gguf/byte_reader.h"
#include "gguf/mapped_file.h"
#include "gguf/parse_file.h"
#include "gguf/tensor_shape.h"

namespace lode::gguf {
namespace {

// Split models have at most 99999 parts: the file names count with five digits.
constexpr int64_t kMaxSplitCount = 99999;

struct SplitKeys {
  int64_t no = 0;             // 0-based
  int64_t count = 0;
  int64_t tensors = -1;       // -1: the key is absent
};

// The split.* keys of a file, or nullopt when it has no split.count. gguf-split writes u16/u16/i32;
// other writers vary the widths, so any integer type is accepted.
std::optional<SplitKeys> split_keys_of(const Metadata& metadata) {
  if (!metadata.contains(kSplitCountKey)) return std::nullopt;
  SplitKeys keys;
  keys.count = metadata.get_int64(kSplitCountKey);
  keys.no = metadata.get_int64(kSplitNoKey);
  if (metadata.contains(kSplitTensorsKey)) keys.tensors = metadata.get_int64(kSplitTensorsKey);
  if (keys.count < 1 || keys.count > kMaxSplitCount)
    fail("{}: {} is {}; it must be 1 to {}", metadata.source(), kSplitCountKey, keys.count,
         kMaxSplitCount);
  if (keys.no < 0 || keys.no >= keys.count)
    fail("{}: {} is {} but {} is {}", metadata.source(), kSplitNoKey, keys.no, kSplitCountKey,
         keys.count);
  if (keys.tensors < -1 || (keys.tensors == -1 && metadata.contains(kSplitTensorsKey)))
    fail("{}: {} is {}; it cannot be negative", metadata.source(), kSplitTensorsKey, keys.tensors);
  return keys;
}

}  // namespace

std::string TensorInfo::shape_string() const {
  return gguf::shape_string(std::span(ne.data(), size_t(n_dims)));
}

Reader::Reader(const std::filesystem::path& path, const ReadOptions& options) {
  append_file(path);
  if (!options.follow_splits) return;
  const auto keys = split_keys_of(metadata_);
  if (!keys) return;
  if (keys->no != 0) {
    const auto name = parse_split_path(path);
    const std::string first = name ? split_path(name->prefix, 1, name->count)
                                   : std::string("the part whose split.no is 0");
    fail("{}: this is part {} of a model split into {} files; open the first part instead: {}",
         path.string(), keys->no + 1, keys->count, first);
  }
  if (keys->count > 1) open_split_model(path);
  if (keys->tensors >= 0 && uint64_t(keys->tensors) != tensors_.size())
    fail("{}: {} says the model has {} tensors, but its {} file(s) hold {}", path.string(),
         kSplitTensorsKey, keys->tensors, files_.size(), tensors_.size());
}

Reader::~Reader() = default;
Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;

void Reader::append_file(const std::filesystem::path& path) {
  auto mapping = std::make_unique<MappedFile>(path);
  ParsedFile parsed = parse_file(mapping->bytes(), path);
  const size_t file_index = files_.size();
  tensors_.reserve(tensors_.size() + parsed.tensors.size());
  for (TensorInfo& t : parsed.tensors) {
    auto [it, inserted] = tensor_index_.emplace(t.name, tensors_.size());
    if (!inserted)
      fail("{}: tensor '{}' is also in {}; a split model holds each tensor once", path.string(),
           shown(t.name), files_[tensors_[it->second].file_index].path.string());
    t.file_index = file_index;
    tensors_.push_back(std::move(t));
  }
  if (file_index == 0) metadata_ = std::move(parsed.metadata);
  else split_metadata_.push_back(std::move(parsed.metadata));
  files_.push_back(std::move(parsed.info));
  mappings_.push_back(std::move(mapping));
}

void Reader::open_split_model(const std::filesystem::path& first) {
  const SplitKeys first_keys = *split_keys_of(metadata_);
  const auto name = parse_split_path(first);
  if (!name)
    fail("{}: this is the first part of a model split into {} files, but its name does not "
         "follow PREFIX-00001-of-{:05d}.gguf, so the other parts cannot be found; give the parts "
         "their gguf-split names", first.string(), first_keys.count, first_keys.count);
  if (name->count != first_keys.count || name->index != 1)
    fail("{}: the file name says part {} of {}, but its {} and {} say part 1 of {}",
         first.string(), name->index, name->count, kSplitNoKey, kSplitCountKey, first_keys.count);
  for (int part = 2; part <= name->count; ++part) {
    const std::filesystem::path path = split_path(name->prefix, part, name->count);
    if (!std::filesystem::exists(path))
      fail("{}: part {} of {} of this split model is missing: {}", first.string(), part,
           name->count, path.string());
    append_file(path);
    const auto keys = split_keys_of(split_metadata_.back());
    if (!keys)
      fail("{}: has no {} key, so it is not part {} of the split model {}", path.string(),
           kSplitCountKey, part, first.string());
    if (keys->no != part - 1 || keys->count != first_keys.count)
      fail("{}: its {} and {} say part {} of {}, but its name says part {} of {}", path.string(),
           kSplitNoKey, kSplitCountKey, keys->no + 1, keys->count, part, name->count);
    if (keys->tensors != first_keys.tensors)
      fail("{}: {} is {} here but {} in the first part {}", path.string(), kSplitTensorsKey,
           keys->tensors, first_keys.tensors, first.string());
  }
}

const TensorInfo* Reader::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& Reader::tensor(std::string_view name) const {
  if (const TensorInfo* t = find_tensor(name)) return *t;
  fail("{}: the model has no tensor named '{}'", files_.front().path.string(), name);
}

uint64_t Reader::tensor_bytes() const {
  uint64_t total = 0;
  for (const TensorInfo& t : tensors_) total += t.size;
  return total;
}

}  // namespace lode::gguf
