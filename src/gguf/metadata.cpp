#include "gguf/metadata.h"

#include "core/error.h"

namespace lode::gguf {

void rethrow_with_key(const std::string& source, std::string_view key) {
  try {
    throw;
  } catch (const Error& e) {
    fail("{}: metadata key '{}': {}", source, escape(key, 96), e.what());
  }
}

void Metadata::set(std::string key, Value value) {
  if (auto it = index_.find(key); it != index_.end()) {
    entries_[it->second].value = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.push_back({std::move(key), std::move(value)});
}

void Metadata::add_new(std::string key, Value value) {
  if (index_.contains(key)) fail("{}: metadata key '{}' appears twice", source_, escape(key, 96));
  index_.emplace(key, entries_.size());
  entries_.push_back({std::move(key), std::move(value)});
}

bool Metadata::erase(std::string_view key) {
  auto it = index_.find(std::string(key));
  if (it == index_.end()) return false;
  entries_.erase(entries_.begin() + ptrdiff_t(it->second));
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].key, i);
  return true;
}

const Value* Metadata::find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries_[it->second].value;
}

const Value& Metadata::at(std::string_view key) const {
  if (const Value* v = find(key)) return *v;
  fail("{}: metadata key '{}' is missing", source_, key);
}

const std::string& Metadata::get_string(std::string_view key) const {
  return with_key(key, [](const Value& v) -> const std::string& { return v.as_string(); });
}

const Array& Metadata::get_array(std::string_view key) const {
  return with_key(key, [](const Value& v) -> const Array& { return v.as_array(); });
}

std::vector<int64_t> Metadata::get_integers(std::string_view key) const {
  return with_key(key, [](const Value& v) { return v.as_array().to_integers(); });
}

const std::vector<std::string>& Metadata::get_strings(std::string_view key) const {
  return with_key(key, [](const Value& v) -> const std::vector<std::string>& { return v.as_array().strings(); });
}

int64_t Metadata::get_int64(std::string_view key) const {
  return with_key(key, [](const Value& v) { return v.to_int64(); });
}

uint64_t Metadata::get_uint64(std::string_view key) const {
  return with_key(key, [](const Value& v) { return v.to_uint64(); });
}

double Metadata::get_double(std::string_view key) const {
  return with_key(key, [](const Value& v) { return v.to_double(); });
}

}  // namespace lode::gguf
