// What Python does to text and JSON values inside Hugging Face chat templates. Templates run in
// Jinja under Python, so `|trim`, `|string` and `|tojson` follow Python's str.strip(), str() and
// json.dumps(); rendering a template natively means reproducing those byte for byte.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace lode::chat {

// Python's str.isspace() for one code point: ASCII whitespace, \x1c-\x1f, NEL, NBSP and the
// Unicode space separators (U+200B ZERO WIDTH SPACE is not one).
bool python_is_space(char32_t code_point);

// Python's str.strip() with no arguments on UTF-8 text: strips python_is_space() code points at
// both ends. Bytes that are not valid UTF-8 count as non-space.
std::string_view python_strip(std::string_view text);

// Python's repr(float) (== str(float)): shortest text that reads back to the same double, in
// fixed notation for exponents -4..15 (`1.0`, `0.0001`, `1e-05`, `1e+16`), `nan`, `inf`, `-inf`.
std::string python_float_repr(double value);

// Python's str() of a JSON scalar as json.loads() returns it: strings unchanged, True/False/None,
// integers in decimal, floats as python_float_repr(). Arrays and objects are refused (templates
// pass those through tojson instead).
std::string python_str(const nlohmann::ordered_json& scalar);

// json.dumps(value, ensure_ascii=False) with the default separators `, ` and `: `, keys in their
// stored order, non-ASCII text as is, control characters as \uXXXX (lowercase hex) and
// NaN/Infinity spelled the way Python spells them.
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace lode::chat
