// JSON as it goes to a client. JSON text must be UTF-8, and a model's bytes need not be: a stray
// continuation byte, or a character cut off by the token limit (the detokenizer releases what it
// held back when generation ends). Those go out as U+FFFD instead of failing the whole response.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace lode::server {

template <class Json>
std::string wire_json(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace lode::server
