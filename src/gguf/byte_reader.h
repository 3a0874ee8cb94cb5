// Bounds-checked little-endian reads from a file's bytes. Every read checks the bytes left first,
// and every failure is a lode::Error naming the file and the byte offset.
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"
#include "gguf/value.h"

namespace lode::gguf {

static_assert(std::endian::native == std::endian::little,
              "GGUF files are little-endian; this reader assumes a little-endian host");

// A name or key read from a file as it appears in messages: escaped (a damaged name may hold any
// bytes) and cut after 96 bytes.
inline std::string shown(std::string_view name) { return escape(name, 96); }

class ByteReader {
public:
  ByteReader(std::span<const uint8_t> bytes, std::string file)
      : bytes_(bytes), file_(std::move(file)) {}

  uint64_t offset() const { return offset_; }
  uint64_t remaining() const { return bytes_.size() - offset_; }
  const std::string& file() const { return file_; }

  // "FILE: byte OFFSET: MESSAGE"
  template <typename... Args>
  [[noreturn]] void fail_at(uint64_t offset, fmt::format_string<Args...> format,
                            Args&&... args) const {
    fail("{}: byte {}: {}", file_, offset, fmt::format(format, std::forward<Args>(args)...));
  }

  // Fails unless n more bytes are there; `what` says what was being read.
  void need(uint64_t n, std::string_view what) const {
    if (n > remaining())
      fail_at(offset_, "the file ends while reading {} ({} bytes needed, {} left): truncated file?",
              what, n, remaining());
  }

  template <class T> T read(std::string_view what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }

  // A GGUF string: u64 length, then that many bytes (no terminator).
  std::string read_string(std::string_view what) {
    const uint64_t length_at = offset_;
    const uint64_t length = read<uint64_t>(what);
    if (length > remaining())
      fail_at(length_at, "{} claims {} bytes but only {} are left in the file", what, length,
              remaining());
    std::string text(reinterpret_cast<const char*>(bytes_.data() + offset_), size_t(length));
    offset_ += length;
    return text;
  }

  // Checks that `count` items of at least `min_item_bytes` each could fit in what is left, before
  // anything is allocated for them.
  void check_count(uint64_t count, uint64_t min_item_bytes, uint64_t count_at,
                   std::string_view what) const {
    if (count > remaining() / min_item_bytes)
      fail_at(count_at, "{} is {}, more than the {} bytes left in the file could hold", what, count,
              remaining());
  }

private:
  std::span<const uint8_t> bytes_;
  std::string file_;
  uint64_t offset_ = 0;
};

}  // namespace lode::gguf
