#include "gguf/file_sink.h"

#include <cerrno>
#include <cstring>

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>

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

namespace {
constexpr size_t kHoleBytes = size_t(64) << 10;

bool all_zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}
}  // namespace

void FileSink::write(const void* data, size_t n) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const size_t piece = std::min(n, kHoleBytes);
    if (piece == kHoleBytes && all_zero(bytes, piece)) skip(piece);
    else put(bytes, piece);
    bytes += piece, n -= piece;
  }
}

void FileSink::put(const uint8_t* data, size_t n) {
  if (std::fwrite(data, 1, n, file_) != n)
    fail("{}: write failed at byte {}: {}", path_.string(), position_, std::strerror(errno));
  position_ += n;
  ends_in_hole_ = false;
}

void FileSink::skip(size_t n) {
  if (std::fflush(file_) != 0 || fseeko(file_, off_t(n), SEEK_CUR) != 0)
    fail("{}: write failed at byte {}: {}", path_.string(), position_, std::strerror(errno));
  position_ += n;
  ends_in_hole_ = true;
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
  // A file that ends in skipped bytes is extended to its length (the hole reads as zeros).
  const bool flushed = std::fflush(file) == 0 && (!ends_in_hole_ || ftruncate(fileno(file), off_t(position_)) == 0);
  const int flush_errno = errno;
  const bool closed = std::fclose(file) == 0;
  if (!flushed || !closed)
    fail("{}: writing failed when closing: {}", path_.string(),
         std::strerror(flushed ? errno : flush_errno));
}

}  // namespace lode::gguf
