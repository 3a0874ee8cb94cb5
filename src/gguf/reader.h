// Reads GGUF files (v2 and v3, little-endian): each file mmap'd read-only, everything validated
// before use (a damaged or hostile file is a lode::Error naming the file, the byte offset or the
// tensor, and the problem; never a crash). A split model (NAME-00001-of-0000N.gguf) opens as one
// model: tensors from every file, metadata from the first.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/quant/types.h"
#include "gguf/metadata.h"
#include "gguf/value.h"

namespace lode::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;

struct TensorInfo {
  std::string name;
  const TypeTraits* type = nullptr;   // never null after reading; type->dequantize may be null
  int n_dims = 0;                     // 1..4
  std::array<int64_t, 4> ne{1, 1, 1, 1};  // elements per dimension, ggml order (ne[0] = row length)
  uint64_t offset = 0;                // from the start of its file's data section, as stored
  size_t file_index = 0;              // which file of a split model holds it (0 otherwise)
  // Its bytes inside the read-only mapping (valid while the Reader lives). The mapping starts on a
  // page, so data is aligned to the file's alignment (32 unless general.alignment says otherwise).
  const uint8_t* data = nullptr;
  size_t size = 0;                    // bytes: row_bytes(type, ne[0]) * ne[1] * ne[2] * ne[3]

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  std::span<const uint8_t> bytes() const { return {data, size}; }
  GgmlType ggml_type() const { return type->type; }
  // "[4096, 151936]": the first n_dims entries of ne.
  std::string shape_string() const;
};

// What one file of the model looked like on disk.
struct FileInfo {
  std::filesystem::path path;
  uint64_t size = 0;            // bytes
  uint32_t version = 0;         // 2 or 3
  uint32_t alignment = 0;       // general.alignment or the default 32
  uint64_t data_offset = 0;     // where the data section starts (aligned end of the header)
  uint64_t n_tensors = 0;       // tensors stored in this file
  uint64_t n_metadata = 0;      // key/value pairs stored in this file
};

struct ReadOptions {
  // true: a split model's first file opens every shard as one model, and a later shard is
  // refused naming the first. false: read exactly the file given (for inspecting one shard).
  bool follow_splits = true;
};

class MappedFile;

class Reader {
public:
  // Opens and validates the whole model; throws lode::Error on any problem.
  explicit Reader(const std::filesystem::path& path, const ReadOptions& options = {});
  ~Reader();
  Reader(Reader&&) noexcept;
  Reader& operator=(Reader&&) noexcept;

  const Metadata& metadata() const { return metadata_; }          // from the first file
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // file order, shard order
  const TensorInfo* find_tensor(std::string_view name) const;     // nullptr when absent
  const TensorInfo& tensor(std::string_view name) const;          // fails naming the tensor
  const std::vector<FileInfo>& files() const { return files_; }   // one per shard, in order
  // The metadata stored in file i itself (for i > 0 of a split model: just its split.* keys).
  const Metadata& file_metadata(size_t i) const {
    return i == 0 ? metadata_ : split_metadata_.at(i - 1);
  }

  uint32_t version() const { return files_.front().version; }
  uint32_t alignment() const { return files_.front().alignment; }
  bool is_split() const { return files_.size() > 1; }
  // Sum of all tensors' bytes.
  uint64_t tensor_bytes() const;

private:
  void append_file(const std::filesystem::path& path);
  void open_split_model(const std::filesystem::path& first);

  Metadata metadata_;
  std::vector<Metadata> split_metadata_;  // files 1.. of a split model
  std::vector<TensorInfo> tensors_;
  std::vector<FileInfo> files_;
  std::vector<std::unique_ptr<MappedFile>> mappings_;
  std::unordered_map<std::string, size_t> tensor_index_;  // name -> position in tensors_
};

// --- split file naming (llama.cpp's gguf-split: PREFIX-00001-of-00003.gguf) ---

// PREFIX-%05d-of-%05d.gguf with a 1-based index.
std::string split_path(std::string_view prefix, int index, int count);
// The PREFIX a model written to `path` takes when it is split: the path without its ".gguf".
std::string split_prefix(const std::filesystem::path& path);
// When `path`'s file name follows the split pattern: its prefix (directory kept), 1-based index
// and count.
struct SplitName {
  std::string prefix;
  int index = 0;
  int count = 0;
};
std::optional<SplitName> parse_split_path(const std::filesystem::path& path);
// The files of the model at `path`: every part of a split model's name, else the path itself.
std::vector<std::filesystem::path> model_files(const std::filesystem::path& path);

// The split.* keys gguf-split writes.
inline constexpr std::string_view kSplitNoKey = "split.no";                  // u16, 0-based
inline constexpr std::string_view kSplitCountKey = "split.count";            // u16
inline constexpr std::string_view kSplitTensorsKey = "split.tensors.count";  // i32, whole model

}  // namespace lode::gguf
