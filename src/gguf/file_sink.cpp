#include "gguf/file_sink.h"

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace lode::gguf {

FileSink::FileSink(const std::filesystem::path& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "wb");
  if (!file_) fail("{}: cannot create: {}", path.string(), std::strerror(errno));
  // Large sequential writes: a bigger buffer means fewer system calls for small tensors.
  std::setvbuf(file_, nullptr, _IOFBF, size_t(1) << 22);
}

FileSink::~FileSink() {
  if (file_) std::fclose(file_);
}

void FileSink::write(const void* data, size_t n) {
  if (n == 0) return;
  if (std::fwrite(data, 1, n, file_) != n)
    fail("{}: write failed at byte {}: {}", path_.string(), position_, std::strerror(errno));
  position_ += n;
}

void FileSink::pad_to(uint64_t alignment) {
  static const uint8_t kZeros[256] = {};
  uint64_t pad = (alignment - position_ % alignment) % alignment;
  while (pad > 0) {
    const size_t n = size_t(std::min<uint64_t>(pad, sizeof(kZeros)));
    write(kZeros, n);
    pad -= n;
  }
}

void FileSink::close() {
  std::FILE* file = file_;
  file_ = nullptr;
  const bool flushed = std::fflush(file) == 0;
  const int flush_errno = errno;
  const bool closed = std::fclose(file) == 0;
  if (!flushed || !closed)
    fail("{}: writing failed when closing: {}", path_.string(),
         std::strerror(flushed ? errno : flush_errno));
}

}  // namespace lode::gguf
