// Row converters of the plain float formats: f32 (a copy), f16 and bf16, bit-exact with ggml.
// Narrowing rounds once, to nearest even; widening is exact (core/fp16.h).
#include <cstring>

#include "core/fp16.h"
#include "core/quant/dequant.h"

namespace lode::quant {

void dequantize_row_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}

void quantize_row_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const auto* half = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(half[i]);
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
