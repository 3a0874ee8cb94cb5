// A model opened for generation: the file, its config, its weights bound once (views into the
// file's mapping, shared by whichever engine runs them) and its tokenizer; the CPU engine's model
// is made only when a command runs on the CPU.
#pragma once
#include <memory>
#include <optional>

#include "cli/model_options.h"
#include "cpu/engine.h"
#include "gguf/reader.h"
#include "model/qwen35moe.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace lode::cli {

struct LoadedModel {
  explicit LoadedModel(const ModelRunOptions& o)
      : reader(o.model),
        config(model::read_config(reader.metadata())),
        weights(std::make_shared<const model::ModelWeights>(model::bind_weights(reader, config))),
        cpu_options_(o.session_options()) {}

  // The tokenizer, read on first use; fails clearly when the file has none.
  const tokenizer::Tokenizer& text() {
    if (!tokenizer_) tokenizer_ = tokenizer::Tokenizer::from_metadata(reader.metadata());
    return *tokenizer_;
  }

  // The CPU engine on these weights with the command's options, made on first use.
  const std::shared_ptr<cpu::CpuModel>& cpu_model() {
    if (!cpu_model_) cpu_model_ = cpu::CpuModel::make(weights, cpu_options_);
    return cpu_model_;
  }
  const cpu::SessionOptions& cpu_options() const { return cpu_options_; }

  int64_t vocab() const { return config.vocab; }

  gguf::Reader reader;
  model::Qwen35MoeConfig config;
  std::shared_ptr<const model::ModelWeights> weights;

 private:
  cpu::SessionOptions cpu_options_;
  std::shared_ptr<cpu::CpuModel> cpu_model_;
  std::optional<tokenizer::Tokenizer> tokenizer_;
};

}  // namespace lode::cli
