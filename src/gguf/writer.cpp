#include "gguf/writer.h"

#include <unordered_set>

#include "core/error.h"
#include "core/output_path.h"
#include "gguf/file_sink.h"
#include "gguf/reader.h"
#include "gguf/serialize.h"
#include "gguf/split_plan.h"
#include "gguf/tensor_shape.h"

namespace lode::gguf {
namespace {

// ggml keeps tensor names in a 64-byte array with a terminating NUL.
constexpr size_t kMaxTensorNameBytes = 63;
// split.count is a u16 in gguf-split's files.
constexpr size_t kMaxSplitFiles = 65535;
constexpr std::string_view kAlignmentKey = "general.alignment";

bool is_split_key(std::string_view key) {
  return key == kSplitNoKey || key == kSplitCountKey || key == kSplitTensorsKey;
}

// The caller's metadata as it goes into the (first) file: split.* keys dropped (the writer writes
// its own when it splits), general.alignment checked against the options or added.
Metadata metadata_to_write(const Metadata& given, uint32_t alignment) {
  Metadata out("writer");
  for (const KeyValue& entry : given.entries()) {
    if (is_split_key(entry.key)) continue;
    if (entry.key == kAlignmentKey &&
        (entry.value.type() != ValueType::U32 || entry.value.as_u32() != alignment))
      fail("the metadata sets general.alignment to {} {} but the writer aligns to {}; set the "
           "alignment with WriteOptions::alignment", value_type_name(entry.value.type()),
           render(entry.value), alignment);
    out.set(entry.key, entry.value);
  }
  if (alignment != kDefaultAlignment && !out.contains(kAlignmentKey))
    out.set(std::string(kAlignmentKey), Value(alignment));
  return out;
}

void add_split_keys(Metadata& metadata, size_t index, size_t count, size_t n_tensors) {
  metadata.set(std::string(kSplitNoKey), Value(uint16_t(index)));
  metadata.set(std::string(kSplitCountKey), Value(uint16_t(count)));
  metadata.set(std::string(kSplitTensorsKey), Value(int32_t(n_tensors)));
}

uint64_t metadata_bytes(const Metadata& metadata) {
  ByteBuffer buffer;
  for (const KeyValue& entry : metadata.entries()) put_key_value(buffer, entry);
  return buffer.size();
}

constexpr uint64_t kFixedHeaderBytes = 4 + 4 + 8 + 8;  // magic, version, tensor and kv counts

}  // namespace

Writer::Writer(WriteOptions options) : options_(options) {
  if (options_.version != 2 && options_.version != 3)
    fail("GGUF version {} cannot be written; lode writes versions 2 and 3", options_.version);
  if (!is_power_of_two(options_.alignment))
    fail("alignment {} is not a non-zero power of two", options_.alignment);
}

Writer::PendingTensor Writer::describe(std::string name, GgmlType type,
                                       std::span<const int64_t> ne) const {
  if (name.empty()) fail("a tensor needs a name");
  if (name.size() > kMaxTensorNameBytes)
    fail("tensor name '{}' is {} bytes; ggml reads names of at most {} bytes", name, name.size(),
         kMaxTensorNameBytes);
  for (const PendingTensor& t : tensors_)
    if (t.name == name) fail("tensor '{}' is added twice", name);
  PendingTensor t{.name = std::move(name), .type = &traits(type), .n_dims = int(ne.size()),
                  .ne = {1, 1, 1, 1}, .size = 0, .bytes = {}, .fill = {}};
  try {
    t.size = tensor_bytes(*t.type, ne);
  } catch (const Error& e) {
    fail("tensor '{}': {}", t.name, e.what());
  }
  std::copy(ne.begin(), ne.end(), t.ne.begin());
  return t;
}

void Writer::add_tensor(std::string name, GgmlType type, std::span<const int64_t> ne,
                        std::span<const uint8_t> bytes) {
  PendingTensor t = describe(std::move(name), type, ne);
  if (bytes.size() != t.size)
    fail("tensor '{}': {} {} needs {} bytes, {} were given", t.name, t.type->name,
         shape_string(ne), t.size, bytes.size());
  t.bytes = bytes;
  tensors_.push_back(std::move(t));
}

void Writer::add_tensor(std::string name, GgmlType type, std::span<const int64_t> ne,
                        FillTensor fill) {
  PendingTensor t = describe(std::move(name), type, ne);
  if (!fill) fail("tensor '{}': no bytes and no function to fill them", t.name);
  t.fill = std::move(fill);
  tensors_.push_back(std::move(t));
}

std::vector<std::filesystem::path> Writer::write(const std::filesystem::path& path) {
  const Metadata base = metadata_to_write(metadata_, options_.alignment);

  // Plan assuming split keys; if everything fits one file it is written without them.
  Metadata split_keys_only("writer");
  add_split_keys(split_keys_only, 0, 1, tensors_.size());
  if (options_.alignment != kDefaultAlignment)
    split_keys_only.set(std::string(kAlignmentKey), Value(options_.alignment));
  std::vector<PlannedTensor> planned;
  planned.reserve(tensors_.size());
  for (const PendingTensor& t : tensors_)
    planned.push_back({tensor_info_bytes(t.name, size_t(t.n_dims)), t.size});
  const uint64_t split_bytes = metadata_bytes(split_keys_only);
  const auto ranges = plan_split(planned, kFixedHeaderBytes + metadata_bytes(base) + split_bytes,
                                 kFixedHeaderBytes + split_bytes, options_.alignment,
                                 options_.max_file_bytes);
  if (ranges.size() > kMaxSplitFiles)
    fail("{}: splitting into {} files is more than the {} gguf-split can number; raise the "
         "maximum file size", path.string(), ranges.size(), kMaxSplitFiles);

  std::vector<std::filesystem::path> written;
  std::vector<std::filesystem::path> partial;
  try {
    if (ranges.size() == 1) {
      written.push_back(path);
      partial.push_back(path.string() + ".partial");
      write_file(partial.back(), base, ranges[0].begin, ranges[0].end);
    } else {
      const std::string prefix = split_prefix(path);
      for (size_t i = 0; i < ranges.size(); ++i) {
        Metadata metadata = i == 0 ? base : split_keys_only;
        add_split_keys(metadata, i, ranges.size(), tensors_.size());
        written.push_back(split_path(prefix, int(i + 1), int(ranges.size())));
        partial.push_back(written.back().string() + ".partial");
        write_file(partial.back(), metadata, ranges[i].begin, ranges[i].end);
      }
    }
    for (size_t i = 0; i < written.size(); ++i) put_in_place(partial[i], written[i]);
  } catch (...) {
    std::error_code ignored;
    for (const auto& p : partial) std::filesystem::remove(p, ignored);
    throw;
  }
  return written;
}

void Writer::write_file(const std::filesystem::path& path, const Metadata& metadata,
                        size_t begin, size_t end) {
  ByteBuffer header;
  header.put<uint32_t>(kMagic);
  header.put<uint32_t>(options_.version);
  header.put<uint64_t>(end - begin);
  header.put<uint64_t>(metadata.size());
  for (const KeyValue& entry : metadata.entries()) put_key_value(header, entry);
  uint64_t offset = 0;
  for (size_t i = begin; i < end; ++i) {
    const PendingTensor& t = tensors_[i];
    put_tensor_info(header, t.name, std::span(t.ne.data(), size_t(t.n_dims)),
                    uint32_t(t.type->type), offset);
    offset = align_up(offset + t.size, options_.alignment);
  }
  header.pad_to(options_.alignment);

  FileSink sink(path);
  sink.write(header.bytes().data(), header.size());
  for (size_t i = begin; i < end; ++i) {
    const PendingTensor& t = tensors_[i];
    if (t.fill) {
      fill_buffer_.resize(size_t(t.size));
      try {
        t.fill(std::span<uint8_t>(fill_buffer_.data(), fill_buffer_.size()));
      } catch (const Error& e) {
        // (named as the file it was to become: the .partial one is removed)
        std::string shown = path.string();
        if (shown.ends_with(".partial")) shown.resize(shown.size() - std::string_view(".partial").size());
        fail("{}: not written: while producing tensor '{}': {}", shown, t.name, e.what());
      }
      sink.write(fill_buffer_.data(), fill_buffer_.size());
    } else {
      sink.write(t.bytes.data(), t.bytes.size());
    }
    sink.pad_to(options_.alignment);
  }
  sink.close();
}

}  // namespace lode::gguf
