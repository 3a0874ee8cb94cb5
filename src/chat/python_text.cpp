#include "chat/python_text.h"

#include "core/error.h"
#include "core/utf8.h"

#include <charconv>
#include <cmath>
#include <optional>

namespace lode::chat {

namespace {

struct DecodedCodePoint {
  char32_t code_point;
  std::size_t length;
};

// One well-formed UTF-8 sequence starting at `text[0]`; nullopt when there is none.
std::optional<DecodedCodePoint> decode_utf8(std::string_view text) {
  if (text.empty()) return std::nullopt;
  const std::size_t length = utf8::valid_sequence_length(text, 0);
  if (length == 0) return std::nullopt;
  return DecodedCodePoint{char32_t(utf8::decode_sequence(text, 0, length)), length};
}

// Length of the space code point that ends `text`, or 0 when the last code point is not a space.
std::size_t trailing_space_length(std::string_view text) {
  // Spaces are at most 3 bytes long in UTF-8 (U+3000 is the highest).
  for (std::size_t length = 1; length <= 3 && length <= text.size(); ++length) {
    const auto decoded = decode_utf8(text.substr(text.size() - length));
    if (decoded && decoded->length == length) {
      return python_is_space(decoded->code_point) ? length : 0;
    }
  }
  return 0;
}

void append_json_string(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += kHex[(c >> 4) & 0xF];
          out += kHex[c & 0xF];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// json.dumps writes non-finite floats as JavaScript names, unlike repr().
std::string json_float(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return python_float_repr(value);
}

void append_json(std::string& out, const nlohmann::ordered_json& value) {
  using Type = nlohmann::ordered_json::value_t;
  switch (value.type()) {
    case Type::array: {
      out += '[';
      bool first = true;
      for (const auto& item : value) {
        if (!first) out += ", ";
        first = false;
        append_json(out, item);
      }
      out += ']';
      return;
    }
    case Type::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        append_json_string(out, key);
        out += ": ";
        append_json(out, item);
      }
      out += '}';
      return;
    }
    case Type::string: append_json_string(out, value.get_ref<const std::string&>()); return;
    case Type::number_float: out += json_float(value.get<double>()); return;
    case Type::binary: fail("chat template: binary JSON values cannot be written as JSON text");
    case Type::discarded: fail("chat template: a discarded JSON value has no JSON text");
    default: out += value.dump(); return;  // null, true/false and integers read the same in both
  }
}

}  // namespace

bool python_is_space(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D:
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x20:
    case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::string_view python_strip(std::string_view text) {
  while (!text.empty()) {
    const auto decoded = decode_utf8(text);
    if (!decoded || !python_is_space(decoded->code_point)) break;
    text.remove_prefix(decoded->length);
  }
  while (const std::size_t length = trailing_space_length(text)) text.remove_suffix(length);
  return text;
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Shortest round-trip digits from to_chars, then laid out the way CPython's repr() lays them.
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value,
                                    std::chars_format::scientific);
  const std::string_view text(buffer, result.ptr);
  const std::size_t e_at = text.find('e');
  std::string_view mantissa = text.substr(0, e_at);
  const int exponent = std::stoi(std::string(text.substr(e_at + 1)));
  std::string sign;
  if (mantissa.front() == '-') sign = "-", mantissa.remove_prefix(1);
  std::string digits;
  for (const char c : mantissa) {
    if (c != '.') digits += c;
  }
  const int decimal_point = exponent + 1;  // digits d1 d2 ... mean 0.d1d2... * 10^decimal_point
  const int n_digits = static_cast<int>(digits.size());
  if (decimal_point > -4 && decimal_point <= 16) {
    if (decimal_point <= 0) return sign + "0." + std::string(-decimal_point, '0') + digits;
    if (decimal_point >= n_digits) {
      return sign + digits + std::string(decimal_point - n_digits, '0') + ".0";
    }
    return sign + digits.substr(0, decimal_point) + "." + digits.substr(decimal_point);
  }
  std::string out = sign + digits.substr(0, 1);
  if (n_digits > 1) out += "." + digits.substr(1);
  const int shown_exponent = decimal_point - 1;
  out += shown_exponent < 0 ? "e-" : "e+";
  const std::string magnitude = std::to_string(std::abs(shown_exponent));
  if (magnitude.size() < 2) out += '0';
  return out + magnitude;
}

std::string python_str(const nlohmann::ordered_json& scalar) {
  using Type = nlohmann::ordered_json::value_t;
  switch (scalar.type()) {
    case Type::null: return "None";
    case Type::boolean: return scalar.get<bool>() ? "True" : "False";
    case Type::string: return scalar.get<std::string>();
    case Type::number_integer: return std::to_string(scalar.get<std::int64_t>());
    case Type::number_unsigned: return std::to_string(scalar.get<std::uint64_t>());
    case Type::number_float: return python_float_repr(scalar.get<double>());
    default:
      fail("chat template: python_str() takes a JSON scalar, got a {}; write arrays and objects "
           "with python_json_dumps()", scalar.type_name());
  }
}

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  append_json(out, value);
  return out;
}

}  // namespace lode::chat
