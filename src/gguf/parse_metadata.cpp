#include "gguf/parse_metadata.h"

#include <algorithm>

namespace lode::gguf {
namespace {

// Fewest bytes one array element of this type takes: the length of an empty string, or the type
// and count of an empty nested array.
uint64_t min_element_bytes(ValueType type) {
  if (type == ValueType::String) return 8;
  if (type == ValueType::Array) return 12;
  return value_type_size(type);
}

ValueType read_type(ByteReader& in, std::string_view what) {
  const uint64_t at = in.offset();
  const uint32_t id = in.read<uint32_t>(what);
  const auto type = value_type_from_id(id);
  if (!type) in.fail_at(at, "{} is {}, not a GGUF value type (0..12)", what, id);
  return *type;
}

template <ScalarValue T> T read_scalar(ByteReader& in) {
  const uint64_t at = in.offset();
  if constexpr (std::is_same_v<T, bool>) {
    const uint8_t byte = in.read<uint8_t>("a bool");
    if (byte > 1) in.fail_at(at, "a bool holds {}, not 0 or 1", byte);
    return byte == 1;
  } else {
    return in.read<T>(value_type_name(value_type_of<T>()));
  }
}

template <ScalarValue T> std::vector<T> read_scalars(ByteReader& in, uint64_t count) {
  std::vector<T> items(static_cast<size_t>(count));  // count was checked against the bytes left
  for (auto&& item : items) item = read_scalar<T>(in);
  return items;
}

Value read_value(ByteReader& in, ValueType type, int depth);

Array read_array(ByteReader& in, int depth) {
  const uint64_t array_at = in.offset();
  if (depth >= kMaxArrayNesting)
    in.fail_at(array_at, "arrays are nested more than {} deep", kMaxArrayNesting);
  const ValueType element_type = read_type(in, "an array's element type");
  const uint64_t count_at = in.offset();
  const uint64_t count = in.read<uint64_t>("an array's length");
  in.check_count(count, min_element_bytes(element_type), count_at,
                 fmt::format("the length of an array of {}", value_type_name(element_type)));
  switch (element_type) {
    case ValueType::U8: return read_scalars<uint8_t>(in, count);
    case ValueType::I8: return read_scalars<int8_t>(in, count);
    case ValueType::U16: return read_scalars<uint16_t>(in, count);
    case ValueType::I16: return read_scalars<int16_t>(in, count);
    case ValueType::U32: return read_scalars<uint32_t>(in, count);
    case ValueType::I32: return read_scalars<int32_t>(in, count);
    case ValueType::F32: return read_scalars<float>(in, count);
    case ValueType::Bool: return read_scalars<bool>(in, count);
    case ValueType::U64: return read_scalars<uint64_t>(in, count);
    case ValueType::I64: return read_scalars<int64_t>(in, count);
    case ValueType::F64: return read_scalars<double>(in, count);
    case ValueType::String: {
      std::vector<std::string> items;
      items.reserve(size_t(std::min<uint64_t>(count, 1 << 16)));  // grows only as bytes are read
      for (uint64_t i = 0; i < count; ++i) items.push_back(in.read_string("a string in an array"));
      return items;
    }
    case ValueType::Array: {
      std::vector<Array> items;
      items.reserve(size_t(std::min<uint64_t>(count, 1 << 12)));
      for (uint64_t i = 0; i < count; ++i) items.push_back(read_array(in, depth + 1));
      return items;
    }
  }
  in.fail_at(array_at, "unreachable: unknown element type");
}

Value read_value(ByteReader& in, ValueType type, int depth) {
  switch (type) {
    case ValueType::U8: return read_scalar<uint8_t>(in);
    case ValueType::I8: return read_scalar<int8_t>(in);
    case ValueType::U16: return read_scalar<uint16_t>(in);
    case ValueType::I16: return read_scalar<int16_t>(in);
    case ValueType::U32: return read_scalar<uint32_t>(in);
    case ValueType::I32: return read_scalar<int32_t>(in);
    case ValueType::F32: return read_scalar<float>(in);
    case ValueType::Bool: return read_scalar<bool>(in);
    case ValueType::U64: return read_scalar<uint64_t>(in);
    case ValueType::I64: return read_scalar<int64_t>(in);
    case ValueType::F64: return read_scalar<double>(in);
    case ValueType::String: return in.read_string("a string value");
    case ValueType::Array: return read_array(in, depth);
  }
  in.fail_at(in.offset(), "unreachable: unknown value type");
}

}  // namespace

void read_metadata(ByteReader& in, uint64_t n_kv, Metadata& out) {
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t key_at = in.offset();
    std::string key = in.read_string("a metadata key");
    if (key.empty()) in.fail_at(key_at, "metadata key {} of {} is empty", i + 1, n_kv);
    if (out.contains(key)) in.fail_at(key_at, "metadata key '{}' appears twice", shown(key));
    const ValueType type = read_type(in, fmt::format("the value type of '{}'", shown(key)));
    const uint64_t value_at = in.offset();
    Value value;
    try {
      value = read_value(in, type, 0);
    } catch (const Error& e) {
      // Name the key whose value was damaged, keeping the offset of the damage itself.
      fail("{} (in the value of metadata key '{}', which starts at byte {})", e.what(), shown(key),
           value_at);
    }
    out.add_new(std::move(key), std::move(value));
  }
}

}  // namespace lode::gguf
