// Sequential writes to a new file, with every I/O failure a lode::Error naming the file. Whole
// 64 KiB runs of zero bytes are skipped rather than written, so they become holes where the file
// system keeps sparse files (a model of zero weights takes no disk; the bytes read back the same).
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
  void put(const uint8_t* data, size_t n);
  void skip(size_t n);

  std::FILE* file_ = nullptr;
  uint64_t position_ = 0;
  bool ends_in_hole_ = false;  // the last bytes were skipped: the file must be extended to them
};

}  // namespace lode::gguf
