// Writes GGUF files: metadata of every type, tensors padded to the alignment, tensor data streamed
// one tensor at a time (from caller-owned bytes, or from a callback that fills a buffer the writer
// provides), so a 20+ GB model never sits in RAM whole. Optionally split into several files by a
// maximum size, the way llama.cpp's gguf-split does (PREFIX-00001-of-00003.gguf, split.* keys,
// every metadata key in the first file, no tensor straddling two files).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "core/quant/types.h"
#include "gguf/metadata.h"
#include "gguf/value.h"

namespace lode::gguf {

struct WriteOptions {
  uint32_t version = 3;         // 3, or 2 on request
  uint32_t alignment = 32;      // a power of two; written as general.alignment when not 32
  // 0: one file. Otherwise the most bytes per file (header included) before starting the next;
  // a single tensor larger than this gets a file of its own. When the model needs more than one
  // file they are named PREFIX-0000i-of-0000N.gguf, where PREFIX is the path given to write()
  // without its ".gguf"; when it fits in one file it is written to the path as given, unsplit.
  uint64_t max_file_bytes = 0;
};

// Fills one tensor's bytes: `out` has exactly the tensor's size.
using FillTensor = std::function<void(std::span<uint8_t> out)>;

class Writer {
public:
  explicit Writer(WriteOptions options = {});

  // Metadata, written in insertion order. general.alignment is added from the options when not
  // 32 (setting it here to another value fails at write()); split.* keys given here are dropped:
  // the writer writes its own when it splits.
  Metadata& metadata() { return metadata_; }
  void set(std::string key, Value value) { metadata_.set(std::move(key), std::move(value)); }

  // A tensor whose bytes the caller keeps alive until write() returns. ne in ggml order
  // (ne[0] = row length, a multiple of the type's block size), 1 to 4 dims; bytes.size() must be
  // the tensor's exact size.
  void add_tensor(std::string name, GgmlType type, std::span<const int64_t> ne,
                  std::span<const uint8_t> bytes);
  // A tensor whose bytes `fill` produces when write() reaches it.
  void add_tensor(std::string name, GgmlType type, std::span<const int64_t> ne, FillTensor fill);
  // Convenience: ne as a braced list, {4096, 151936}.
  void add_tensor(std::string name, GgmlType type, std::initializer_list<int64_t> ne,
                  std::span<const uint8_t> bytes) {
    add_tensor(std::move(name), type, std::span<const int64_t>(ne.begin(), ne.size()), bytes);
  }
  void add_tensor(std::string name, GgmlType type, std::initializer_list<int64_t> ne,
                  FillTensor fill) {
    add_tensor(std::move(name), type, std::span<const int64_t>(ne.begin(), ne.size()),
               std::move(fill));
  }

  size_t n_tensors() const { return tensors_.size(); }
  // Writes everything; returns the files written, in order. Each file is written to a temporary
  // name beside it and renamed when complete, so a failure never leaves a half-written model
  // under the final name. Throws lode::Error on any problem (I/O, invalid tensors).
  std::vector<std::filesystem::path> write(const std::filesystem::path& path);

private:
  struct PendingTensor {
    std::string name;
    const TypeTraits* type;
    int n_dims;
    std::array<int64_t, 4> ne;
    uint64_t size;
    std::span<const uint8_t> bytes;  // used when fill is empty
    FillTensor fill;
  };
  PendingTensor describe(std::string name, GgmlType type, std::span<const int64_t> ne) const;
  // Writes tensors [begin, end) with `metadata` to one file.
  void write_file(const std::filesystem::path& path, const Metadata& metadata, size_t begin,
                  size_t end);

  WriteOptions options_;
  Metadata metadata_{"writer"};
  std::vector<PendingTensor> tensors_;
  std::vector<uint8_t> fill_buffer_;  // reused for every tensor produced by a FillTensor
};

}  // namespace lode::gguf
