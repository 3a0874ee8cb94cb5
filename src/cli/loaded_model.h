// A model opened for generation: the file, its config, its tokenizer and one CPU session, kept
// together because the session reads the file's mapped weights.
#pragma once
#include <memory>
#include <optional>

#include "cli/model_options.h"
#include "cpu/session.h"
#include "gguf/reader.h"
#include "model/qwen35moe.h"
#include "tokenizer/tokenizer.h"

namespace lode::cli {

struct LoadedModel {
  explicit LoadedModel(const ModelRunOptions& o)
      : reader(o.model),
        config(model::read_config(reader.metadata())),
        session(reader, config, o.session_options()) {}

  // The tokenizer, read on first use; fails clearly when the file has none.
  const tokenizer::Tokenizer& text() {
    if (!tokenizer_) tokenizer_ = tokenizer::Tokenizer::from_metadata(reader.metadata());
    return *tokenizer_;
  }

  gguf::Reader reader;
  model::Qwen35MoeConfig config;
  cpu::Session session;

 private:
  std::optional<tokenizer::Tokenizer> tokenizer_;
};

}  // namespace lode::cli
