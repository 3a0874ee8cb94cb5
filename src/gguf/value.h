// GGUF metadata values: the 13 value types a GGUF key can hold, arrays of any of them (arrays of
// arrays included, each inner array with its own element type), typed accessors that fail with a
// clear lode::Error on the wrong type, and a one-line rendering for listings (`lode inspect`).
#pragma once
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace lode::gguf {

// Numbering as stored in GGUF files (enum gguf_type).
enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7,
  String = 8, Array = 9, U64 = 10, I64 = 11, F64 = 12,
};
inline constexpr uint32_t kValueTypeCount = 13;

// "u8", "i32", "f64", "bool", "string", "array", ...
const char* value_type_name(ValueType type);
// The type for an id read from a file, or nullopt for ids GGUF does not define.
std::optional<ValueType> value_type_from_id(uint32_t id);
// Bytes one value of a fixed-size type takes in a file; 0 for String and Array.
size_t value_type_size(ValueType type);

class Value;

// The fixed-size scalar types a Value or Array can hold, spelled as C++ types.
template <class T>
concept ScalarValue =
    std::same_as<T, uint8_t> || std::same_as<T, int8_t> || std::same_as<T, uint16_t> ||
    std::same_as<T, int16_t> || std::same_as<T, uint32_t> || std::same_as<T, int32_t> ||
    std::same_as<T, float> || std::same_as<T, bool> || std::same_as<T, uint64_t> ||
    std::same_as<T, int64_t> || std::same_as<T, double>;

// The ValueType of a scalar C++ type: value_type_of<uint32_t>() == ValueType::U32.
template <ScalarValue T> constexpr ValueType value_type_of() {
  if constexpr (std::same_as<T, uint8_t>) return ValueType::U8;
  else if constexpr (std::same_as<T, int8_t>) return ValueType::I8;
  else if constexpr (std::same_as<T, uint16_t>) return ValueType::U16;
  else if constexpr (std::same_as<T, int16_t>) return ValueType::I16;
  else if constexpr (std::same_as<T, uint32_t>) return ValueType::U32;
  else if constexpr (std::same_as<T, int32_t>) return ValueType::I32;
  else if constexpr (std::same_as<T, float>) return ValueType::F32;
  else if constexpr (std::same_as<T, bool>) return ValueType::Bool;
  else if constexpr (std::same_as<T, uint64_t>) return ValueType::U64;
  else if constexpr (std::same_as<T, int64_t>) return ValueType::I64;
  else return ValueType::F64;
}

// An array: one element type, n elements stored contiguously by type (so a 248k-entry vocabulary
// is one std::vector<std::string>, and numeric arrays are spans).
class Array {
public:
  Array();  // an empty array of u8 (GGUF arrays always name an element type)
  template <ScalarValue T> Array(std::vector<T> items) : items_(std::move(items)) {}
  Array(std::vector<std::string> items);
  Array(std::vector<Array> items);  // nested: each inner array keeps its own element type
  // An empty array of the given element type.
  static Array empty(ValueType element_type);

  ValueType element_type() const { return ValueType(items_.index()); }
  size_t size() const;
  bool empty() const { return size() == 0; }

  // Element i as a Value (a copy; nested arrays are copied too). Fails when i >= size().
  Value at(size_t i) const;

  // Typed views; each fails with lode::Error when the element type is not T.
  template <ScalarValue T> const std::vector<T>& values() const;
  const std::vector<std::string>& strings() const;
  const std::vector<Array>& arrays() const;
  // Any integer element type widened to int64 (fails for u64 elements above INT64_MAX, or
  // non-integer element types): for keys whose integer width varies between writers.
  std::vector<int64_t> to_integers() const;

  bool operator==(const Array&) const = default;

private:
  // Alternative index == ValueType id; Array (id 9) holds nested arrays.
  std::variant<std::vector<uint8_t>, std::vector<int8_t>, std::vector<uint16_t>,
               std::vector<int16_t>, std::vector<uint32_t>, std::vector<int32_t>,
               std::vector<float>, std::vector<bool>, std::vector<std::string>,
               std::vector<Array>, std::vector<uint64_t>, std::vector<int64_t>,
               std::vector<double>>
      items_;
};

// One metadata value. Constructed from the exact C++ type: Value(uint32_t(5)) is a u32,
// Value(5) an i32, Value(true) a bool, Value("text") a string.
class Value {
public:
  Value() : storage_(uint8_t(0)) {}
  template <ScalarValue T> Value(T v) : storage_(v) {}
  Value(std::string v) : storage_(std::move(v)) {}
  Value(std::string_view v) : storage_(std::string(v)) {}
  Value(const char* v) : storage_(std::string(v)) {}
  Value(Array v) : storage_(std::move(v)) {}

  ValueType type() const { return ValueType(storage_.index()); }
  bool is_integer() const;  // any of u8..i64
  bool is_number() const;   // an integer, f32 or f64

  // Exact accessors: fail with lode::Error ("expected u32, found string \"abc\"") on another type.
  uint8_t as_u8() const { return get<uint8_t>(); }
  int8_t as_i8() const { return get<int8_t>(); }
  uint16_t as_u16() const { return get<uint16_t>(); }
  int16_t as_i16() const { return get<int16_t>(); }
  uint32_t as_u32() const { return get<uint32_t>(); }
  int32_t as_i32() const { return get<int32_t>(); }
  uint64_t as_u64() const { return get<uint64_t>(); }
  int64_t as_i64() const { return get<int64_t>(); }
  float as_f32() const { return get<float>(); }
  double as_f64() const { return get<double>(); }
  bool as_bool() const { return get<bool>(); }
  const std::string& as_string() const;
  const Array& as_array() const;
  template <ScalarValue T> T get() const;

  // Lenient accessors for keys whose width varies between writers (u32 here, i32 there):
  // any integer type, range-checked; any number as a double.
  int64_t to_int64() const;    // fails for u64 values above INT64_MAX
  uint64_t to_uint64() const;  // fails for negative values
  double to_double() const;    // any integer or float type

  bool operator==(const Value&) const = default;

private:
  [[noreturn]] void wrong_type(ValueType wanted) const;
  // Alternative index == ValueType id.
  std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string,
               Array, uint64_t, int64_t, double>
      storage_;
};

// How much of a value render() shows.
struct RenderLimits {
  size_t max_items = 8;         // longer arrays: the first max_items, then "... N items"
  // Longer strings are cut (at a UTF-8 boundary) and marked with their length; 0: no limit.
  size_t max_string_bytes = 0;
};

// One line, for people: 42, 1.5, true, "text with \"quotes\"\n" (quoted, escaped; invalid UTF-8
// bytes as \xNN), [1, 2, 3, ... 248320 items], [[1, 2], ["a"]].
std::string render(const Value& value, const RenderLimits& limits = {});
std::string render(const Array& array, const RenderLimits& limits = {});
// A string quoted and escaped the way render() shows it.
std::string quote(std::string_view text, size_t max_bytes = 0);
// The same escaping without the quotes, for names inside messages; a cut string ends in "...".
std::string escape(std::string_view text, size_t max_bytes = 0);

// --- template definitions ---

template <ScalarValue T> T Value::get() const {
  if (const T* v = std::get_if<T>(&storage_)) return *v;
  wrong_type(value_type_of<T>());
}

namespace detail {
[[noreturn]] void wrong_element_type(ValueType have, ValueType wanted);
}  // namespace detail

template <ScalarValue T> const std::vector<T>& Array::values() const {
  if (const auto* v = std::get_if<std::vector<T>>(&items_)) return *v;
  detail::wrong_element_type(element_type(), value_type_of<T>());
}

}  // namespace lode::gguf
