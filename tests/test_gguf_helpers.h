// Helpers shared by the GGUF tests: a temporary directory that cleans up after itself, a
// byte-level GGUF builder (independent of lode's writer, so reader tests do not just check the
// writer against itself), and an assertion that a call fails with a given message.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace lode::test {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device random;
    path_ = std::filesystem::temp_directory_path() /
            ("lode-gguf-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) +
             "-" + std::to_string(random()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Appends GGUF fields byte by byte; offset() says where the next one will land, so tests can
// check that error messages name the right byte.
class RawGguf {
public:
  RawGguf& u8(uint8_t v) { return put(v); }
  RawGguf& u16(uint16_t v) { return put(v); }
  RawGguf& u32(uint32_t v) { return put(v); }
  RawGguf& i32(int32_t v) { return put(v); }
  RawGguf& u64(uint64_t v) { return put(v); }
  RawGguf& i64(int64_t v) { return put(v); }
  RawGguf& f32(float v) { return put(v); }
  RawGguf& str(std::string_view s) {
    u64(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& raw(std::string_view s) {
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& zeros(size_t n) {
    bytes_.resize(bytes_.size() + n, 0);
    return *this;
  }
  RawGguf& pad_to(size_t alignment) {
    bytes_.resize((bytes_.size() + alignment - 1) / alignment * alignment, 0);
    return *this;
  }
  // "GGUF", version, tensor count, key/value count.
  RawGguf& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
  }
  // key, value type 4 (u32), value
  RawGguf& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  RawGguf& kv_string(std::string_view key, std::string_view v) { return str(key).u32(8).str(v); }
  // name, n_dims, ne..., ggml type, offset
  RawGguf& tensor(std::string_view name, std::initializer_list<int64_t> ne, uint32_t type,
                  uint64_t offset) {
    str(name).u32(uint32_t(ne.size()));
    for (int64_t n : ne) i64(n);
    return u32(type).u64(offset);
  }
  size_t offset() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

private:
  template <class T> RawGguf& put(T v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
    return *this;
  }
  std::vector<uint8_t> bytes_;
};

// Runs f; passes when it throws lode::Error whose message contains every one of `parts`.
inline ::testing::AssertionResult fails_with(const std::function<void()>& f,
                                             std::initializer_list<std::string_view> parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (std::string_view part : parts)
      if (message.find(part) == std::string::npos)
        return ::testing::AssertionFailure()
               << "message lacks \"" << part << "\": " << message;
    return ::testing::AssertionSuccess() << message;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-lode exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace lode::test
