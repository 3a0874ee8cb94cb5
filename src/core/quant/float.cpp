// Row converters of the plain float formats: f32 (a copy), f16 and bf16, bit-exact with ggml.
// Narrowing rounds once, to nearest even (core/fp16.h); widening is exact, with one ggml detail
// (signalling NaNs come out quiet) handled below.
#include <bit>
#include <cstring>

#include "core/fp16.h"
#include "core/quant/dequant.h"

namespace lode::quant {
namespace {

// fp16 -> fp32 for whole rows: the same result as fp16_to_fp32, except that a signalling NaN comes
// out quiet (0x00400000 set), as ggml's conversion does (it ends in a float multiply). The cases
// are told apart with carries into bit 15 instead of branches, so that the loop vectorizes.
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t magnitude = h & 0x7fff;
  const uint32_t is_special = (magnitude + 0x0400) >> 15;  // exponent all ones: infinity or NaN
  const uint32_t is_nan = (magnitude + 0x03ff) >> 15;      // ... with a nonzero mantissa
  const uint32_t is_normal = (magnitude + 0x7c00) >> 15;   // exponent not zero
  // Normal numbers: move exponent and mantissa into place and rebias the exponent (15 -> 127);
  // the special ones get another +112 to reach exponent 255.
  const uint32_t wide = ((magnitude << 13) + 0x38000000u + is_special * 0x38000000u) | is_nan << 22;
  // Zero and subnormals: mantissa * 2^-24, exact in fp32.
  const uint32_t tiny = std::bit_cast<uint32_t>(float(int32_t(magnitude)) * (1.0f / 16777216.0f));
  const uint32_t normal_mask = 0u - is_normal;
  return std::bit_cast<float>(sign | (wide & normal_mask) | (tiny & ~normal_mask));
}

}  // namespace

void dequantize_row_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}

void quantize_row_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const auto* half = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(half[i]);
}

void quantize_row_f16(const float* src, void* dst, int64_t n) {
  auto* half = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) half[i] = fp32_to_fp16(src[i]);
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  const auto* brain = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(brain[i]);
}

void quantize_row_bf16(const float* src, void* dst, int64_t n) {
  auto* brain = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) brain[i] = fp32_to_bf16(src[i]);
}

}  // namespace lode::quant
