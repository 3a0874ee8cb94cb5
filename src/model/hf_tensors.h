// Where each GGUF tensor of a qwen35moe model comes from in a Hugging Face checkpoint, and the
// transforms llama.cpp's converter applies on the way (so files are interchangeable both ways).
#pragma once
#include <string>
#include <vector>

#include "model/qwen35moe.h"
#include "model/safetensors.h"

namespace lode::model {

class HfTensorSource {
public:
  // Detects the tensor prefix (`model.language_model.` or `model.`) and the expert layout.
  HfTensorSource(const SafetensorsCheckpoint& checkpoint, const Qwen35MoeConfig& config);

  // The GGUF tensor `spec` as float32, row-major in ggml order (ne[0] fastest), transformed.
  std::vector<float> tensor(const TensorSpec& spec) const;

  const std::string& prefix() const { return prefix_; }

private:
  std::string hf_layer(int64_t block) const;  // "model.layers.3." or "mtp.layers.0."
  const SafeTensor& find(const std::string& name) const;
  const SafeTensor* find_any(std::initializer_list<std::string> names) const;
  std::vector<float> load(const std::string& name) const;
  std::vector<float> experts(int64_t block, const std::string& which) const;
  std::vector<float> delta_net(const TensorSpec& spec, const std::string& layer) const;
  std::vector<float> block_tensor(const TensorSpec& spec, const std::string& base) const;

  const SafetensorsCheckpoint& ckpt_;
  const Qwen35MoeConfig& config_;
  std::string prefix_;
};

}  // namespace lode::model
