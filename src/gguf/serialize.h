// GGUF's byte encoding of metadata and tensor infos, appended to an in-memory buffer (a header is
// at most megabytes; tensor data is streamed separately by the writer).
#pragma once
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "gguf/metadata.h"
#include "gguf/value.h"

namespace lode::gguf {

class ByteBuffer {
public:
  template <class T> void put(T value) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &value, sizeof(T));
  }
  void put_bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + n);
  }
  void put_string(std::string_view text) {
    put<uint64_t>(text.size());
    put_bytes(text.data(), text.size());
  }
  void pad_to(uint64_t alignment) {
    bytes_.resize((bytes_.size() + alignment - 1) / alignment * alignment, 0);
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }

private:
  std::vector<uint8_t> bytes_;
};

// One key/value pair: key, value type, value.
void put_key_value(ByteBuffer& out, const KeyValue& entry);
// A tensor info: name, n_dims, ne[0..n_dims), ggml type id, data offset.
void put_tensor_info(ByteBuffer& out, std::string_view name, std::span<const int64_t> ne,
                     uint32_t type_id, uint64_t offset);
// Bytes put_tensor_info() appends.
inline uint64_t tensor_info_bytes(std::string_view name, size_t n_dims) {
  return 8 + name.size() + 4 + 8 * n_dims + 4 + 8;
}

}  // namespace lode::gguf
