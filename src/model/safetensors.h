// Reads Hugging Face safetensors checkpoints: one file, or several with a
// model.safetensors.index.json. Each file is mmap'd read-only and its JSON header validated
// (offsets inside the data, sizes matching dtype x shape, no duplicate names) before use.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lode::gguf {
class MappedFile;
}

namespace lode::model {

enum class StDtype { F32, F16, BF16, F64, I64, I32, I16, I8, U8, Bool };

struct SafeTensor {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;  // torch order (outermost first)
  const uint8_t* data = nullptr;
  size_t size = 0;             // bytes
  size_t file_index = 0;

  int64_t n_elements() const;
};

class SafetensorsCheckpoint {
public:
  // `path`: a folder (model.safetensors.index.json, else every *.safetensors in it), or one file.
  explicit SafetensorsCheckpoint(const std::filesystem::path& path);
  ~SafetensorsCheckpoint();
  SafetensorsCheckpoint(SafetensorsCheckpoint&&) noexcept;

  const std::vector<SafeTensor>& tensors() const { return tensors_; }
  const SafeTensor* find(std::string_view name) const;  // nullptr when absent
  const SafeTensor& at(std::string_view name) const;    // fails naming the tensor
  const std::vector<std::filesystem::path>& files() const { return files_; }

  // The tensor as float32 (F32, F16 and BF16 are exact; other dtypes fail).
  static std::vector<float> to_float(const SafeTensor& t);

private:
  void add_file(const std::filesystem::path& path);

  std::vector<std::filesystem::path> files_;
  std::vector<std::unique_ptr<gguf::MappedFile>> mappings_;
  std::vector<SafeTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace lode::model
