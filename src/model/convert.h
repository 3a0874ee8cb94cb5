// `lode convert`: a Hugging Face qwen3_5_moe checkpoint folder (config.json flat or nested under
// text_config; tensors under `model.` or `model.language_model.`; experts per expert or fused; one
// or several safetensors files; F32/BF16/F16) to a GGUF following llama.cpp's conventions exactly:
// its names and keys, +1 folded into the zero-centred norms, ssm_a = -exp(A_log), the conv weight
// squeezed, DeltaNet value heads reordered from HF's grouped order to ggml's tiled order, the MTP
// block (mtp.*) as block n_layers with the nextn tensors.
#pragma once
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/quant/types.h"
#include "model/qwen35moe.h"

namespace lode::model {

struct ConvertOptions {
  // Type of the matrices; norms, router, conv, ssm_a, ssm_dt and the shared-expert gate vector
  // stay F32 (as in llama.cpp's files). F32, F16, BF16 or Q8_0.
  GgmlType outtype = GgmlType::F32;
  std::function<void(size_t, size_t, const std::string&)> on_tensor;  // (index, count, name)
};

// The model config from a transformers config.json (flat, or with the text model under
// "text_config"). The vocabulary size is config's vocab_size.
Qwen35MoeConfig config_from_hf(const nlohmann::json& config_json);

// Converts the checkpoint in `hf_dir`; returns the files written.
std::vector<std::filesystem::path> convert_checkpoint(const std::filesystem::path& hf_dir,
                                                      const std::filesystem::path& out,
                                                      const ConvertOptions& options);

}  // namespace lode::model
