// Sequential writes to a new file, with every I/O failure a lode::Error naming the file.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>

namespace lode::gguf {

class FileSink {
public:
  // Creates (or truncates) the file.
  explicit FileSink(const std::filesystem::path& path);
  ~FileSink();  // closes without checking; call close() to find out whether everything landed
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;

  void write(const void* data, size_t n);
  // Zero bytes up to the next multiple of `alignment`.
  void pad_to(uint64_t alignment);
  uint64_t position() const { return position_; }
  // Flushes, syncs nothing (the OS writes back), and reports any error so far.
  void close();

private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  uint64_t position_ = 0;
};

}  // namespace lode::gguf
