// The errors a request can end in, as OpenAI's API reports them: an HTTP status and a JSON body
// {"error": {"message", "type", "param", "code"}} (or, on the Anthropic route, Anthropic's
// {"type": "error", "error": {"type", "message"}}). Request handling throws ApiError; the HTTP layer
// turns it (and anything else thrown) into a response, so no request can take the server down.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <stdexcept>
#include <string>

namespace lode::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, std::string message, std::optional<std::string> param = {},
           std::optional<std::string> code = {})
      : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)),
        code_(std::move(code)) {}

  int status() const { return status_; }
  const std::string& type() const { return type_; }
  nlohmann::ordered_json body() const;
  // Anthropic's shape; the type is Anthropic's name for the status (anthropic_error_type).
  nlohmann::ordered_json anthropic_body() const;

 private:
  int status_;
  std::string type_;
  std::optional<std::string> param_;
  std::optional<std::string> code_;
};

// 400 invalid_request_error, naming the field at fault (param) when there is one.
ApiError bad_request(std::string message, std::optional<std::string> param = {});

// Anthropic's error type for an HTTP status: invalid_request_error (400, 405), authentication_error,
// not_found_error, request_too_large, rate_limit_error, overloaded_error (503), else api_error.
const char* anthropic_error_type(int status);

// The JSON error body for a message, type and code (null param).
nlohmann::ordered_json error_body(const std::string& message, const std::string& type,
                                  std::optional<std::string> code = {});

}  // namespace lode::server
