#include "server/json_fields.h"

#include <fmt/format.h>

#include <limits>

#include "server/api_error.h"

namespace lode::server {

using json = nlohmann::ordered_json;

// A field that is absent or null counts as not given (clients send explicit nulls).
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string string_or_empty(const json& object, const char* name) {
  if (!object.is_object()) return "";
  const json* v = field(object, name);
  return v && v->is_string() ? v->get<std::string>() : "";
}

std::optional<double> number_in(const json& body, const char* name, double lo, double hi) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_request(fmt::format("{} must be a number, got {}", name, v->type_name()), name);
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) throw bad_request(fmt::format("{} {} is outside [{}, {}]", name, x, lo, hi), name);
  return x;
}

std::optional<int64_t> integer_in(const json& body, const char* name, int64_t lo, int64_t hi) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) throw bad_request(fmt::format("{} must be an integer, got {}", name, v->dump()), name);
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    throw bad_request(fmt::format("{} {} is outside [{}, {}]", name, v->dump(), lo, hi), name);
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) throw bad_request(fmt::format("{} {} is outside [{}, {}]", name, x, lo, hi), name);
  return x;
}

std::optional<bool> boolean(const json& body, const char* name, const std::string& param) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(fmt::format("{} must be true or false, got {}", param, v->dump()), param);
  return v->get<bool>();
}

std::string check_model(const json& body, const ModelNames& names) {
  const json* v = field(body, "model");
  if (!v) return names.id;
  if (!v->is_string()) throw bad_request(fmt::format("model must be a string, got {}", v->type_name()), "model");
  const std::string asked = v->get<std::string>();
  if (!names.includes(asked))
    throw ApiError(404, "invalid_request_error",
                   fmt::format("The model `{}` does not exist; this server serves `{}` (GET /v1/models)", asked,
                               names.id),
                   "model", "model_not_found");
  return asked;
}

}  // namespace lode::server
