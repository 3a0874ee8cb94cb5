// The errors a request can end in, as OpenAI's API reports them: an HTTP status and a JSON body
// {"error": {"message", "type", "param", "code"}}. Request handling throws ApiError; the HTTP layer
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
  nlohmann::ordered_json body() const;

 private:
  int status_;
  std::string type_;
  std::optional<std::string> param_;
  std::optional<std::string> code_;
};

// 400 invalid_request_error, naming the field at fault (param) when there is one.
ApiError bad_request(std::string message, std::optional<std::string> param = {});

// The JSON error body for a message, type and code (null param).
nlohmann::ordered_json error_body(const std::string& message, const std::string& type,
                                  std::optional<std::string> code = {});

}  // namespace lode::server
