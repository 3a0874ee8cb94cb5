#include "gguf/serialize.h"

namespace lode::gguf {
namespace {

void put_value(ByteBuffer& out, const Value& value);

template <class T> void put_items(ByteBuffer& out, const std::vector<T>& items) {
  if constexpr (std::is_same_v<T, bool>) {
    for (bool b : items) out.put<uint8_t>(b ? 1 : 0);
  } else {
    out.put_bytes(items.data(), items.size() * sizeof(T));
  }
}

void put_array(ByteBuffer& out, const Array& array) {
  out.put<uint32_t>(uint32_t(array.element_type()));
  out.put<uint64_t>(array.size());
  switch (array.element_type()) {
    case ValueType::U8: put_items(out, array.values<uint8_t>()); break;
    case ValueType::I8: put_items(out, array.values<int8_t>()); break;
    case ValueType::U16: put_items(out, array.values<uint16_t>()); break;
    case ValueType::I16: put_items(out, array.values<int16_t>()); break;
    case ValueType::U32: put_items(out, array.values<uint32_t>()); break;
    case ValueType::I32: put_items(out, array.values<int32_t>()); break;
    case ValueType::F32: put_items(out, array.values<float>()); break;
    case ValueType::Bool: put_items(out, array.values<bool>()); break;
    case ValueType::U64: put_items(out, array.values<uint64_t>()); break;
    case ValueType::I64: put_items(out, array.values<int64_t>()); break;
    case ValueType::F64: put_items(out, array.values<double>()); break;
    case ValueType::String:
      for (const std::string& s : array.strings()) out.put_string(s);
      break;
    case ValueType::Array:
      for (const Array& inner : array.arrays()) put_array(out, inner);
      break;
  }
}

void put_value(ByteBuffer& out, const Value& value) {
  switch (value.type()) {
    case ValueType::U8: out.put(value.as_u8()); break;
    case ValueType::I8: out.put(value.as_i8()); break;
    case ValueType::U16: out.put(value.as_u16()); break;
    case ValueType::I16: out.put(value.as_i16()); break;
    case ValueType::U32: out.put(value.as_u32()); break;
    case ValueType::I32: out.put(value.as_i32()); break;
    case ValueType::F32: out.put(value.as_f32()); break;
    case ValueType::Bool: out.put<uint8_t>(value.as_bool() ? 1 : 0); break;
    case ValueType::U64: out.put(value.as_u64()); break;
    case ValueType::I64: out.put(value.as_i64()); break;
    case ValueType::F64: out.put(value.as_f64()); break;
    case ValueType::String: out.put_string(value.as_string()); break;
    case ValueType::Array: put_array(out, value.as_array()); break;
  }
}

}  // namespace

void put_key_value(ByteBuffer& out, const KeyValue& entry) {
  out.put_string(entry.key);
  out.put<uint32_t>(uint32_t(entry.value.type()));
  put_value(out, entry.value);
}

void put_tensor_info(ByteBuffer& out, std::string_view name, std::span<const int64_t> ne,
                     uint32_t type_id, uint64_t offset) {
  out.put_string(name);
  out.put<uint32_t>(uint32_t(ne.size()));
  for (int64_t n : ne) out.put<int64_t>(n);
  out.put<uint32_t>(type_id);
  out.put<uint64_t>(offset);
}

}  // namespace lode::gguf
