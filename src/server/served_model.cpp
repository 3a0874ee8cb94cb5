#include "server/served_model.h"

#include <algorithm>
#include <filesystem>

#include "engine/generate.h"

namespace lode::server {
namespace {

std::string model_id(const gguf::Metadata& metadata, const std::string& path) {
  std::string name = metadata.get_string_or("general.name", "");
  if (!name.empty()) return name;
  return std::filesystem::path(path).stem().string();
}

}  // namespace

ServedModel::ServedModel(const std::string& path)
    : reader(path), config(model::read_config(reader.metadata())),
      tokenizer(tokenizer::Tokenizer::from_metadata(reader.metadata())),
      id(model_id(reader.metadata(), path)), json_tokens(engine::json_vocabulary(tokenizer)) {}

ModelNames::ModelNames(std::string id_, const std::vector<std::string>& aliases_) : id(std::move(id_)) {
  for (const std::string& alias : aliases_)
    if (!includes(alias)) aliases.push_back(alias);
}

bool ModelNames::includes(const std::string& name) const {
  return name == id || std::find(aliases.begin(), aliases.end(), name) != aliases.end();
}

}  // namespace lode::server
