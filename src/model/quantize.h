// Re-quantizes a GGUF model: every tensor that may change type is dequantized to float32 and
// quantized to the target type; the rest are copied byte for byte. Metadata is copied except
// general.file_type (stale after re-quantizing; llama.cpp only displays it). Streams one tensor at
// a time (rows in parallel).
#pragma once
#include <filesystem>
#include <functional>
#include <string>

#include "core/quant/types.h"
#include "gguf/reader.h"
#include "model/recipe.h"

namespace lode::model {

struct QuantizeOptions {
  GgmlType type = GgmlType::Q8_0;  // the target type (when no recipe is given)
  // When set: each qwen35moe tensor gets the recipe's type for its role (unknown names are
  // copied as they are), and general.file_type is the recipe's.
  const Recipe* recipe = nullptr;
  uint64_t max_file_bytes = 0;     // split the output (0: one file)
  // Called after each tensor: (index, count, name); for progress reporting.
  std::function<void(size_t, size_t, const std::string&)> on_tensor;
};

// Whether `t` may take `type`: a matrix (2+ dims; 1-D norms and biases stay as they are) whose rows
// are whole blocks of the type, from a type lode can read.
bool may_requantize(const gguf::TensorInfo& t, GgmlType type);

// Writes the re-quantized model to `out`; returns the files written.
std::vector<std::filesystem::path> quantize_model(const gguf::Reader& in,
                                                  const std::filesystem::path& out,
                                                  const QuantizeOptions& options);

}  // namespace lode::model
