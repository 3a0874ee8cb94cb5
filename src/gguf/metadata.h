// A GGUF file's key/value metadata: entries in file order, lookup by key, typed getters whose
// errors name the key and where it came from.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf/value.h"

namespace lode::gguf {

struct KeyValue {
  std::string key;
  Value value;
};

class Metadata {
public:
  // `source` names where the entries came from (a file path), for error messages.
  explicit Metadata(std::string source = "metadata") : source_(std::move(source)) {}

  // Sets a key: replaces the value of an existing key in place (keeping its position), or
  // appends a new one.
  void set(std::string key, Value value);
  // Appends a key read from a file; fails when the key is already present.
  void add_new(std::string key, Value value);
  // Removes a key; returns whether it was there.
  bool erase(std::string_view key);

  const Value* find(std::string_view key) const;  // nullptr when absent
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  // Fails naming the key and source when absent.
  const Value& at(std::string_view key) const;

  // Typed getters: fail when the key is absent or holds another type, naming key and source.
  template <ScalarValue T> T get(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const Array& get_array(std::string_view key) const;
  std::vector<int64_t> get_integers(std::string_view key) const;     // an array of any integer type
  const std::vector<std::string>& get_strings(std::string_view key) const;  // an array of strings
  int64_t get_int64(std::string_view key) const;    // any integer type, range-checked
  uint64_t get_uint64(std::string_view key) const;  // any integer type, non-negative
  double get_double(std::string_view key) const;    // any number
  // The same with a fallback used only when the key is absent (a wrong type still fails).
  template <ScalarValue T> T get_or(std::string_view key, T fallback) const {
    return contains(key) ? get<T>(key) : fallback;
  }
  int64_t get_int64_or(std::string_view key, int64_t fallback) const {
    return contains(key) ? get_int64(key) : fallback;
  }
  std::string get_string_or(std::string_view key, std::string fallback) const {
    return contains(key) ? get_string(key) : fallback;
  }

  const std::vector<KeyValue>& entries() const { return entries_; }  // file order
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::string& source() const { return source_; }

private:
  // Runs f(value) and re-throws a lode::Error with the key and source in front of its message.
  template <class F> auto with_key(std::string_view key, F&& f) const -> decltype(f(at(key)));

  std::string source_;
  std::vector<KeyValue> entries_;
  std::unordered_map<std::string, size_t> index_;  // key -> position in entries_
};

// --- template definitions ---

[[noreturn]] void rethrow_with_key(const std::string& source, std::string_view key);

template <class F>
auto Metadata::with_key(std::string_view key, F&& f) const -> decltype(f(at(key))) {
  const Value& value = at(key);
  try {
    return f(value);
  } catch (...) {
    rethrow_with_key(source_, key);
  }
}

template <ScalarValue T> T Metadata::get(std::string_view key) const {
  return with_key(key, [](const Value& v) { return v.get<T>(); });
}

}  // namespace lode::gguf
