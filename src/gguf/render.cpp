// One-line renderings of metadata values, for people reading `lode inspect`.
#include <fmt/format.h>

#include "core/utf8.h"
#include "gguf/value.h"

namespace lode::gguf {
namespace {

void append_escaped_byte(std::string& out, uint8_t c) {
  switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    default:
      if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
      else out += char(c);
  }
}

template <class T> std::string render_scalar(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
    return fmt::format("{}", int(v));  // as a number, not a character
  } else if constexpr (std::is_floating_point_v<T>) {
    // The shortest text that reads back exactly, marked as a float when it looks like an integer.
    std::string text = fmt::format("{}", v);
    if (text.find_first_not_of("-0123456789") == std::string::npos) text += ".0";
    return text;
  } else {
    return fmt::format("{}", v);
  }
}

std::string render_item(const std::string& v, const RenderLimits& limits) {
  return quote(v, limits.max_string_bytes);
}
std::string render_item(const Array& v, const RenderLimits& limits) { return render(v, limits); }
template <class T> std::string render_item(T v, const RenderLimits&) { return render_scalar(v); }

}  // namespace

namespace {

// Appends `text` escaped, stopping before max_bytes (0: no limit); returns whether it was cut.
bool append_escaped(std::string& out, std::string_view text, size_t max_bytes) {
  size_t i = 0;
  while (i < text.size()) {
    const size_t length = utf8::valid_sequence_length(text, i);
    if (max_bytes != 0 && i + std::max<size_t>(length, 1) > max_bytes) return true;
    if (length == 0) {
      out += fmt::format("\\x{:02x}", uint8_t(text[i]));
      i += 1;
    } else if (length == 1) {
      append_escaped_byte(out, uint8_t(text[i]));
      i += 1;
    } else {
      out.append(text.substr(i, length));
      i += length;
    }
  }
  return false;
}

}  // namespace

std::string quote(std::string_view text, size_t max_bytes) {
  std::string out = "\"";
  const bool cut = append_escaped(out, text, max_bytes);
  out += '"';
  if (cut) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

std::string escape(std::string_view text, size_t max_bytes) {
  std::string out;
  if (append_escaped(out, text, max_bytes)) out += "...";
  return out;
}

std::string render(const Array& array, const RenderLimits& limits) {
  const size_t n = array.size();
  const size_t shown = limits.max_items != 0 && n > limits.max_items ? limits.max_items : n;
  std::string out = "[";
  auto append_items = [&](const auto& items) {
    for (size_t i = 0; i < shown; ++i) {
      if (i) out += ", ";
      out += render_item(items[i], limits);
    }
  };
  switch (array.element_type()) {
    case ValueType::U8: append_items(array.values<uint8_t>()); break;
    case ValueType::I8: append_items(array.values<int8_t>()); break;
    case ValueType::U16: append_items(array.values<uint16_t>()); break;
    case ValueType::I16: append_items(array.values<int16_t>()); break;
    case ValueType::U32: append_items(array.values<uint32_t>()); break;
    case ValueType::I32: append_items(array.values<int32_t>()); break;
    case ValueType::F32: append_items(array.values<float>()); break;
    case ValueType::Bool: append_items(array.values<bool>()); break;
    case ValueType::String: append_items(array.strings()); break;
    case ValueType::Array: append_items(array.arrays()); break;
    case ValueType::U64: append_items(array.values<uint64_t>()); break;
    case ValueType::I64: append_items(array.values<int64_t>()); break;
    case ValueType::F64: append_items(array.values<double>()); break;
  }
  if (shown < n) out += fmt::format("{}... {} items", shown ? ", " : "", n);
  out += "]";
  return out;
}

std::string render(const Value& value, const RenderLimits& limits) {
  switch (value.type()) {
    case ValueType::U8: return render_scalar(value.as_u8());
    case ValueType::I8: return render_scalar(value.as_i8());
    case ValueType::U16: return render_scalar(value.as_u16());
    case ValueType::I16: return render_scalar(value.as_i16());
    case ValueType::U32: return render_scalar(value.as_u32());
    case ValueType::I32: return render_scalar(value.as_i32());
    case ValueType::F32: return render_scalar(value.as_f32());
    case ValueType::Bool: return render_scalar(value.as_bool());
    case ValueType::String: return quote(value.as_string(), limits.max_string_bytes);
    case ValueType::Array: return render(value.as_array(), limits);
    case ValueType::U64: return render_scalar(value.as_u64());
    case ValueType::I64: return render_scalar(value.as_i64());
    case ValueType::F64: return render_scalar(value.as_f64());
  }
  return "?";
}

}  // namespace lode::gguf
