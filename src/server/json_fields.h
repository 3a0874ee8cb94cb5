// Reading typed fields out of a request body, shared by the OpenAI and Anthropic routes: each
// helper returns nothing for an absent or null field and throws a 400 ApiError naming the field
// (`param`) when it has the wrong type or is out of range.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "server/served_model.h"

namespace lode::server {

// A field that is absent or null counts as not given (clients send explicit nulls).
const nlohmann::ordered_json* field(const nlohmann::ordered_json& body, const char* name);

// The field's text when it is a string, else "" (absent, null or another type): for fields whose
// every wrong value the caller refuses alike.
std::string string_or_empty(const nlohmann::ordered_json& object, const char* name);

std::optional<double> number_in(const nlohmann::ordered_json& body, const char* name, double lo, double hi);
std::optional<int64_t> integer_in(const nlohmann::ordered_json& body, const char* name, int64_t lo, int64_t hi);
// param: the name to report (a dotted path for nested fields).
std::optional<bool> boolean(const nlohmann::ordered_json& body, const char* name, const std::string& param);

// `model`, when given, must be one of the served model's names: 400 when not a string, 404 when
// another. Returns the name the reply gives: the one asked for, else the model's id.
std::string check_model(const nlohmann::ordered_json& body, const ModelNames& names);

}  // namespace lode::server
