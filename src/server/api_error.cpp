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

nlohmann::ordered_json ApiError::anthropic_body() const {
  return {{"type", "error"}, {"error", {{"type", anthropic_error_type(status_)}, {"message", what()}}}};
}

const char* anthropic_error_type(int status) {
  switch (status) {
    case 400: case 405: case 422: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return "api_error";
  }
}

ApiError bad_request(std::string message, std::optional<std::string> param) {
  return ApiError(400, "invalid_request_error", std::move(message), std::move(param));
}

nlohmann::ordered_json error_body(const std::string& message, const std::string& type,
                                  std::optional<std::string> code) {
  return ApiError(0, type, message, {}, std::move(code)).body();
}

}  // namespace lode::server
