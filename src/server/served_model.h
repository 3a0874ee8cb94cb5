// The model a server serves: the file (its mapped weights stay open), its config, its tokenizer and
// the id clients name it by. Shared, read-only, between the HTTP threads (which tokenize) and the
// engine worker (which owns the session that reads the weights).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/reader.h"
#include "model/qwen35moe.h"
#include "tokenizer/tokenizer.h"

namespace lode::server {

struct ServedModel {
  // Opens the file; fails (lode::Error) when it is not a qwen35moe model with a tokenizer.
  explicit ServedModel(const std::string& path);

  gguf::Reader reader;
  model::Qwen35MoeConfig config;
  tokenizer::Tokenizer tokenizer;
  std::string id;  // general.name, else the file name without .gguf
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
