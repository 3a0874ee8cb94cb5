#include "gguf/value.h"

#include <limits>

#include "core/error.h"

namespace lode::gguf {
namespace {

constexpr const char* kTypeNames[kValueTypeCount] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
constexpr size_t kTypeSizes[kValueTypeCount] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

// A short description of a value for error messages: its type and a glimpse of its contents.
std::string describe(const Value& value) {
  return fmt::format("{} {}", value_type_name(value.type()),
                     render(value, RenderLimits{.max_items = 3, .max_string_bytes = 40}));
}

}  // namespace

const char* value_type_name(ValueType type) {
  const auto id = uint32_t(type);
  return id < kValueTypeCount ? kTypeNames[id] : "invalid";
}

std::optional<ValueType> value_type_from_id(uint32_t id) {
  if (id >= kValueTypeCount) return std::nullopt;
  return ValueType(id);
}

size_t value_type_size(ValueType type) {
  const auto id = uint32_t(type);
  return id < kValueTypeCount ? kTypeSizes[id] : 0;
}

namespace detail {
void wrong_element_type(ValueType have, ValueType wanted) {
  fail("expected an array of {}, found an array of {}", value_type_name(wanted),
       value_type_name(have));
}
}  // namespace detail

// --- Array ---

Array::Array() : items_(std::vector<uint8_t>{}) {}
Array::Array(std::vector<std::string> items) : items_(std::move(items)) {}
Array::Array(std::vector<Array> items) : items_(std::move(items)) {}

Array Array::empty(ValueType element_type) {
  Array array;
  switch (element_type) {
    case ValueType::U8: array.items_ = std::vector<uint8_t>{}; break;
    case ValueType::I8: array.items_ = std::vector<int8_t>{}; break;
    case ValueType::U16: array.items_ = std::vector<uint16_t>{}; break;
    case ValueType::I16: array.items_ = std::vector<int16_t>{}; break;
    case ValueType::U32: array.items_ = std::vector<uint32_t>{}; break;
    case ValueType::I32: array.items_ = std::vector<int32_t>{}; break;
    case ValueType::F32: array.items_ = std::vector<float>{}; break;
    case ValueType::Bool: array.items_ = std::vector<bool>{}; break;
    case ValueType::String: array.items_ = std::vector<std::string>{}; break;
    case ValueType::Array: array.items_ = std::vector<Array>{}; break;
    case ValueType::U64: array.items_ = std::vector<uint64_t>{}; break;
    case ValueType::I64: array.items_ = std::vector<int64_t>{}; break;
    case ValueType::F64: array.items_ = std::vector<double>{}; break;
    default: fail("invalid GGUF value type id {}", uint32_t(element_type));
  }
  return array;
}

size_t Array::size() const {
  return std::visit([](const auto& items) { return items.size(); }, items_);
}

Value Array::at(size_t i) const {
  if (i >= size()) fail("array index {} is out of range (the array has {} items)", i, size());
  return std::visit([i](const auto& items) { return Value(items[i]); }, items_);
}

const std::vector<std::string>& Array::strings() const {
  if (const auto* v = std::get_if<std::vector<std::string>>(&items_)) return *v;
  detail::wrong_element_type(element_type(), ValueType::String);
}

const std::vector<Array>& Array::arrays() const {
  if (const auto* v = std::get_if<std::vector<Array>>(&items_)) return *v;
  detail::wrong_element_type(element_type(), ValueType::Array);
}

std::vector<int64_t> Array::to_integers() const {
  return std::visit(
      [this](const auto& items) -> std::vector<int64_t> {
        using T = typename std::decay_t<decltype(items)>::value_type;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          std::vector<int64_t> out;
          out.reserve(items.size());
          for (T v : items) {
            if constexpr (std::is_same_v<T, uint64_t>)
              if (v > uint64_t(std::numeric_limits<int64_t>::max()))
                fail("array item {} does not fit in a signed 64-bit integer", v);
            out.push_back(int64_t(v));
          }
          return out;
        } else {
          fail("expected an array of integers, found an array of {}",
               value_type_name(element_type()));
        }
      },
      items_);
}

// --- Value ---

bool Value::is_integer() const {
  switch (type()) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
    case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64:
      return true;
    default:
      return false;
  }
}

bool Value::is_number() const {
  return is_integer() || type() == ValueType::F32 || type() == ValueType::F64;
}

const std::string& Value::as_string() const {
  if (const auto* v = std::get_if<std::string>(&storage_)) return *v;
  wrong_type(ValueType::String);
}

const Array& Value::as_array() const {
  if (const auto* v = std::get_if<Array>(&storage_)) return *v;
  wrong_type(ValueType::Array);
}

void Value::wrong_type(ValueType wanted) const {
  fail("expected {}, found {}", value_type_name(wanted), describe(*this));
}

int64_t Value::to_int64() const {
  if (!is_integer()) fail("expected an integer, found {}", describe(*this));
  if (const auto* v = std::get_if<uint64_t>(&storage_)) {
    if (*v > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("{} does not fit in a signed 64-bit integer", *v);
    return int64_t(*v);
  }
  return std::visit(
      [](const auto& v) -> int64_t {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_integral_v<T>) return int64_t(v);
        else return 0;  // unreachable: is_integer() was checked
      },
      storage_);
}

uint64_t Value::to_uint64() const {
  if (const auto* v = std::get_if<uint64_t>(&storage_)) return *v;
  const int64_t v = to_int64();
  if (v < 0) fail("expected a non-negative integer, found {}", v);
  return uint64_t(v);
}

double Value::to_double() const {
  if (!is_number()) fail("expected a number, found {}", describe(*this));
  return std::visit(
      [](const auto& v) -> double {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_arithmetic_v<T>) return double(v);
        else return 0;  // unreachable: is_number() was checked
      },
      storage_);
}

}  // namespace lode::gguf
