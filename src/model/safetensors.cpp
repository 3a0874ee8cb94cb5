#include "model/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/fp16.h"
#include "gguf/mapped_file.h"

namespace lode::model {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

struct DtypeInfo {
  const char* name;
  StDtype dtype;
  size_t bytes;
};
constexpr DtypeInfo kDtypes[] = {
    {"F32", StDtype::F32, 4}, {"F16", StDtype::F16, 2}, {"BF16", StDtype::BF16, 2},
    {"F64", StDtype::F64, 8}, {"I64", StDtype::I64, 8}, {"I32", StDtype::I32, 4},
    {"I16", StDtype::I16, 2}, {"I8", StDtype::I8, 1},   {"U8", StDtype::U8, 1},
    {"BOOL", StDtype::Bool, 1},
};

const DtypeInfo& dtype_info(std::string_view name, const fs::path& file, std::string_view tensor) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d;
  fail("{}: tensor '{}' has dtype {}, which lode does not read (F32, F16, BF16 and integer types)",
       file.string(), tensor, name);
}

// The header: u64 length, then that many bytes of JSON.
json parse_header(const gguf::MappedFile& file, const fs::path& path, size_t* data_start) {
  if (file.size() < 8) fail("{}: too short to be a safetensors file ({} bytes)", path.string(), file.size());
  uint64_t length = 0;
  std::memcpy(&length, file.data(), 8);
  if (length > file.size() - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes)", path.string(), length, file.size());
  *data_start = 8 + size_t(length);
  try {
    return json::parse(file.data() + 8, file.data() + 8 + length);
  } catch (const json::exception& e) {
    fail("{}: the safetensors header is not valid JSON: {}", path.string(), e.what());
  }
}

// One header entry -> a validated SafeTensor pointing into the mapping.
SafeTensor parse_entry(const std::string& name, const json& entry, const gguf::MappedFile& file,
                       size_t data_start, const fs::path& path) {
  if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
      !entry.contains("data_offsets"))
    fail("{}: tensor '{}' lacks dtype, shape or data_offsets", path.string(), name);
  const auto& offsets = entry["data_offsets"];
  if (!entry["dtype"].is_string() || !entry["shape"].is_array() || !offsets.is_array() || offsets.size() != 2 ||
      !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
    fail("{}: tensor '{}' has a malformed dtype, shape or data_offsets", path.string(), name);
  SafeTensor t;
  t.name = name;
  const DtypeInfo& d = dtype_info(entry["dtype"].get<std::string>(), path, name);
  t.dtype = d.dtype;
  uint64_t count = 1;
  for (const auto& dim : entry["shape"]) {
    if (!dim.is_number_unsigned()) fail("{}: tensor '{}' has a non-integer dimension", path.string(), name);
    const uint64_t n = dim.get<uint64_t>();
    // (at most 2^56 values, so that their bytes, up to 8 each, stay within 64 bits: [2^62] of F32 wrapped to 0)
    if (n != 0 && count > (uint64_t(1) << 56) / n) fail("{}: tensor '{}' is absurdly large", path.string(), name);
    count *= n;
    t.shape.push_back(int64_t(n));
  }
  const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
  const uint64_t data_size = file.size() - data_start;
  if (begin > end || end > data_size)
    fail("{}: tensor '{}' has data_offsets [{}, {}] outside the {} data bytes", path.string(), name, begin, end,
         data_size);
  if (end - begin != count * d.bytes)
    fail("{}: tensor '{}' holds {} bytes but {} x {} needs {}", path.string(), name, end - begin, count,
         d.name, count * d.bytes);
  t.data = file.data() + data_start + begin;
  t.size = size_t(end - begin);
  return t;
}

// The shard files an index names, in first-use order.
std::vector<fs::path> files_from_index(const fs::path& index_path) {
  std::ifstream in(index_path);
  json index;
  try {
    index = json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", index_path.string(), e.what());
  }
  if (!index.contains("weight_map") || !index["weight_map"].is_object())
    fail("{}: has no weight_map object", index_path.string());
  std::vector<fs::path> files;
  std::set<std::string> seen;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) fail("{}: weight_map entry '{}' is not a file name", index_path.string(), name);
    const std::string f = file.get<std::string>();
    if (f.find('/') != std::string::npos || f.find("..") != std::string::npos)
      fail("{}: weight_map names '{}', which is not a file beside the index", index_path.string(), f);
    if (seen.insert(f).second) files.push_back(index_path.parent_path() / f);
  }
  return files;
}

}  // namespace

int64_t SafeTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const fs::path& path) {
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    if (fs::exists(path / "model.safetensors.index.json")) {
      files = files_from_index(path / "model.safetensors.index.json");
    } else {
      for (const auto& e : fs::directory_iterator(path))
        if (e.path().extension() == ".safetensors") files.push_back(e.path());
      std::sort(files.begin(), files.end());
    }
    if (files.empty()) fail("{}: no *.safetensors files in this folder", path.string());
  } else {
    files.push_back(path);
  }
  for (const auto& f : files) add_file(f);
}

SafetensorsCheckpoint::~SafetensorsCheckpoint() = default;
SafetensorsCheckpoint::SafetensorsCheckpoint(SafetensorsCheckpoint&&) noexcept = default;

void SafetensorsCheckpoint::add_file(const fs::path& path) {
  auto file = std::make_unique<gguf::MappedFile>(path);
  size_t data_start = 0;
  const json header = parse_header(*file, path, &data_start);
  if (!header.is_object()) fail("{}: the safetensors header is not a JSON object", path.string());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    SafeTensor t = parse_entry(name, entry, *file, data_start, path);
    t.file_index = files_.size();
    if (!index_.emplace(name, tensors_.size()).second)
      fail("{}: tensor '{}' appears twice in the checkpoint", path.string(), name);
    tensors_.push_back(std::move(t));
  }
  files_.push_back(path);
  mappings_.push_back(std::move(file));
}

const SafeTensor* SafetensorsCheckpoint::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafeTensor& SafetensorsCheckpoint::at(std::string_view name) const {
  const SafeTensor* t = find(name);
  if (!t) fail("the checkpoint has no tensor '{}'", name);
  return *t;
}

std::vector<float> SafetensorsCheckpoint::to_float(const SafeTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements()));
  const size_t n = out.size();
  switch (t.dtype) {
    case StDtype::F32: std::memcpy(out.data(), t.data, n * 4); break;
    case StDtype::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = fp16_to_fp32(h);
      }
      break;
    case StDtype::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, t.data + 2 * i, 2);
        out[i] = bf16_to_fp32(b);
      }
      break;
    default: fail("tensor '{}' is not a float tensor (F32, F16 or BF16)", t.name);
  }
  return out;
}

}  // namespace lode::model
