// A model file opened for a test: its reader, config and bound weights (shared by sessions and
// engines made on them).
#pragma once
#include <filesystem>
#include <memory>

#include "gguf/reader.h"
#include "model/weights.h"

namespace lode::test {

struct LoadedWeights {
  explicit LoadedWeights(const std::filesystem::path& path)
      : reader(path), config(model::read_config(reader.metadata())),
        weights(std::make_shared<const model::ModelWeights>(model::bind_weights(reader, config))) {}
  gguf::Reader reader;
  model::Qwen35MoeConfig config;
  std::shared_ptr<const model::ModelWeights> weights;
};

}  // namespace lode::test
