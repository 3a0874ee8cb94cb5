#include "core/quant/types.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "core/error.h"
#include "core/quant/blocks.h"
#include "core/quant/dequant.h"

namespace lode {
namespace {

using namespace quant;

// One row per type. Rows whose converters are null are types lode can size (so it can list and
// skip them) but not convert.
const TypeTraits kTypes[] = {
    {GgmlType::F32, "f32", 1, 4, dequantize_row_f32, quantize_row_f32},
    {GgmlType::F16, "f16", 1, 2, dequantize_row_f16, quantize_row_f16},
    {GgmlType::BF16, "bf16", 1, 2, dequantize_row_bf16, quantize_row_bf16},
    {GgmlType::Q4_0, "q4_0", QK4_0, sizeof(BlockQ4_0), dequantize_row_q4_0, quantize_row_q4_0},
    {GgmlType::Q4_1, "q4_1", QK4_1, sizeof(BlockQ4_1), dequantize_row_q4_1, quantize_row_q4_1},
    {GgmlType::Q5_0, "q5_0", QK5_0, sizeof(BlockQ5_0), dequantize_row_q5_0, quantize_row_q5_0},
    {GgmlType::Q5_1, "q5_1", QK5_1, sizeof(BlockQ5_1), dequantize_row_q5_1, quantize_row_q5_1},
    {GgmlType::Q8_0, "q8_0", QK8_0, sizeof(BlockQ8_0), dequantize_row_q8_0, quantize_row_q8_0},
    {GgmlType::Q8_1, "q8_1", QK8_1, sizeof(BlockQ8_1), nullptr, nullptr},
    {GgmlType::Q2_K, "q2_K", QK_K, sizeof(BlockQ2_K), dequantize_row_q2_K, nullptr},
    {GgmlType::Q3_K, "q3_K", QK_K, sizeof(BlockQ3_K), dequantize_row_q3_K, nullptr},
    {GgmlType::Q4_K, "q4_K", QK_K, sizeof(BlockQ4_K), dequantize_row_q4_K, quantize_row_q4_K},
    {GgmlType::Q5_K, "q5_K", QK_K, sizeof(BlockQ5_K), dequantize_row_q5_K, quantize_row_q5_K},
    {GgmlType::Q6_K, "q6_K", QK_K, sizeof(BlockQ6_K), dequantize_row_q6_K, quantize_row_q6_K},
    {GgmlType::Q8_K, "q8_K", QK_K, sizeof(BlockQ8_K), nullptr, nullptr},
    {GgmlType::IQ2_XXS, "iq2_xxs", QK_K, sizeof(BlockIQ2_XXS), dequantize_row_iq2_xxs, nullptr},
    {GgmlType::IQ2_XS, "iq2_xs", QK_K, sizeof(BlockIQ2_XS), dequantize_row_iq2_xs, nullptr},
    {GgmlType::IQ2_S, "iq2_s", QK_K, sizeof(BlockIQ2_S), dequantize_row_iq2_s, nullptr},
    {GgmlType::IQ3_XXS, "iq3_xxs", QK_K, sizeof(BlockIQ3_XXS), dequantize_row_iq3_xxs, nullptr},
    {GgmlType::IQ3_S, "iq3_s", QK_K, sizeof(BlockIQ3_S), dequantize_row_iq3_s, nullptr},
    {GgmlType::IQ1_S, "iq1_s", QK_K, sizeof(BlockIQ1_S), dequantize_row_iq1_s, nullptr},
    {GgmlType::IQ1_M, "iq1_m", QK_K, sizeof(BlockIQ1_M), dequantize_row_iq1_m, nullptr},
    {GgmlType::IQ4_NL, "iq4_nl", QK4_NL, sizeof(BlockIQ4_NL), dequantize_row_iq4_nl, quantize_row_iq4_nl},
    {GgmlType::IQ4_XS, "iq4_xs", QK_K, sizeof(BlockIQ4_XS), dequantize_row_iq4_xs, quantize_row_iq4_xs},
    {GgmlType::TQ1_0, "tq1_0", QK_K, sizeof(BlockTQ1_0), nullptr, nullptr},
    {GgmlType::TQ2_0, "tq2_0", QK_K, sizeof(BlockTQ2_0), nullptr, nullptr},
    {GgmlType::MXFP4, "mxfp4", QK_MXFP4, sizeof(BlockMXFP4), dequantize_row_mxfp4, nullptr},
    {GgmlType::I8, "i8", 1, 1, nullptr, nullptr},
    {GgmlType::I16, "i16", 1, 2, nullptr, nullptr},
    {GgmlType::I32, "i32", 1, 4, nullptr, nullptr},
    {GgmlType::I64, "i64", 1, 8, nullptr, nullptr},
    {GgmlType::F64, "f64", 1, 8, nullptr, nullptr},
};

bool iequals(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](char x, char y) { return std::tolower(uint8_t(x)) == std::tolower(uint8_t(y)); });
}

}  // namespace

const TypeTraits* find_type(uint32_t id) {
  for (const auto& t : kTypes)
    if (uint32_t(t.type) == id) return &t;
  return nullptr;
}

const TypeTraits& traits(GgmlType type) {
  const TypeTraits* t = find_type(uint32_t(type));
  if (!t) fail("unknown ggml type id {}", uint32_t(type));
  return *t;
}

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (const auto& t : kTypes)
    if (iequals(t.name, name)) return t.type;
  return std::nullopt;
}

size_t row_bytes(GgmlType type, int64_t n) {
  const TypeTraits& t = traits(type);
  if (n < 0 || n % t.block_size != 0)
    fail("{} values do not make whole {} blocks of {} values", n, t.name, t.block_size);
  return size_t(n / t.block_size) * t.block_bytes;
}

const TypeTraits* all_types(size_t* count) {
  *count = std::size(kTypes);
  return kTypes;
}

}  // namespace lode
