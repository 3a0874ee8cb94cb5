// Row converters of the plain float formats: f32 (a copy), f16 and bf16, bit-exact with ggml.
// Narrowing rounds once, to nearest even; widening is exact (core/fp16.h).
#include <immintrin.h>

#include <cstring>

#include "core/fp16.h"
#include "core/host_isa.h"
#include "core/quant/dequant.h"

namespace lode::quant {

void dequantize_row_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}

void quantize_row_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, size_t(n) * sizeof(float));
}

namespace {

// F16C's conversion, 8 halves an instruction: exact, NaN payloads kept and quieted, the bits of
// fp16_to_fp32 (Fp16.RowsConvertEveryHalfAsOneHalf); 10x the portable loop, which the compiler
// barely vectorizes. The CPU engine's f16 weights and K/V cells come through here.
__attribute__((target("avx2,f16c"))) void f16_row_f16c(const uint16_t* half, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(half + i))));
  for (; i < n; ++i) dst[i] = fp16_to_fp32(half[i]);
}

}  // namespace

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const auto* half = static_cast<const uint16_t*>(src);
  if (host_has_avx2()) return f16_row_f16c(half, dst, n);
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
