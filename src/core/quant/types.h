// ggml's tensor types: one table of traits (name, block size, bytes per block, row converters),
// looked up by the numeric id GGUF files store. Numbering follows ggml's enum ggml_type.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace lode {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

// n is a whole number of blocks (the caller checks with row_bytes()).
using DequantizeRow = void (*)(const void* src, float* dst, int64_t n);
using QuantizeRow = void (*)(const float* src, void* dst, int64_t n);

struct TypeTraits {
  GgmlType type;
  const char* name;         // ggml's spelling, e.g. "q4_K"
  int64_t block_size;       // values per block
  size_t block_bytes;       // bytes per block
  DequantizeRow dequantize; // to float32, bit-exact with ggml; null when lode cannot read it
  QuantizeRow quantize;     // from float32; null when lode cannot write it
};

// The traits of a type id as stored in a file, or nullptr when ggml has no such type.
const TypeTraits* find_type(uint32_t id);
// The traits of a known type.
const TypeTraits& traits(GgmlType type);
// Case-insensitive lookup by ggml's name ("q4_k", "Q4_K", "bf16").
std::optional<GgmlType> type_from_name(std::string_view name);
// Bytes of n values of this type; throws lode::Error when n is not a whole number of blocks.
size_t row_bytes(GgmlType type, int64_t n);
// Every type in the table, for listings and tests.
const TypeTraits* all_types(size_t* count);

}  // namespace lode
