// The model a server serves: the file (its mapped weights stay open), its config, its tokenizer and
// the id clients name it by. Shared, read-only, between the HTTP threads (which tokenize) and the
// engine worker (which owns the session that reads the weights).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gguf/reader.h"
#include "model/qwen35moe.h"
#include "sample/json_tokens.h"
#include "tokenizer/tokenizer.h"

namespace lode::server {

struct ServedModel {
  // Opens the file; fails (lode::Error) when it is not a qwen35moe model with a tokenizer.
  explicit ServedModel(const std::string& path);
  ServedModel(const ServedModel&) = delete;  // (json_tokens views the tokenizer's bytes)
  ServedModel& operator=(const ServedModel&) = delete;

  gguf::Reader reader;
  model::Qwen35MoeConfig config;
  tokenizer::Tokenizer tokenizer;
  std::string id;  // general.name, else the file name without .gguf
  // The tokens as a JSON reply's mask reads them (engine::json_vocabulary), made once for all.
  std::shared_ptr<const sample::JsonTokens> json_tokens;
};

// The names requests may give as `model`: the served model's id and the aliases the server was
// started with (`lode serve --alias NAME`, for clients that hard-code a model name).
struct ModelNames {
  // Aliases equal to the id or to an earlier alias are dropped.
  explicit ModelNames(std::string id, const std::vector<std::string>& aliases = {});
  bool includes(const std::string& name) const;
  std::string id;
  std::vector<std::string> aliases;
};

}  // namespace lode::server
