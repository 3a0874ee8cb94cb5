// A whole file mapped read-only into memory (mmap), unmapped when destroyed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

namespace lode::gguf {

class MappedFile {
public:
  // Fails with lode::Error naming the path when it cannot be opened or mapped, is not a regular
  // file, or is empty.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace lode::gguf
