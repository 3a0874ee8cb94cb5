#include "server/api_error.h"

namespace lode::server {
namespace {

nlohmann::ordered_json optional_string(const std::optional<std::string>& s) {
  return s ? nlohmann::ordered_json(*s) : nlohmann::ordered_json(nullptr);
}

}  // namespace

nlohmann::ordered_json ApiError::body() const {
  return {{"error", {{"message", what()}, {"type", type_}, {"param", optional_string(param_)},
                     {"code", optional_string(code_)}}}};
}

ApiError bad_request(std::string message, std::optional<std::string> param) {
  return ApiError(400, "invalid_request_error", std::move(message), std::move(param));
}

nlohmann::ordered_json error_body(const std::string& message, const std::string& type,
                                  std::optional<std::string> code) {
  return ApiError(0, type, message, {}, std::move(code)).body();
}

}  // namespace lode::server
