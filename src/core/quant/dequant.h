// Host reference row converters for every ggml type lode reads or writes. n is a multiple of the
// type's block size. Dequantizers are bit-exact with ggml's; the exact quantizers (F16, BF16,
// Q8_0, Q4_0) are byte-identical with ggml's reference ones; the others are lode's own searches.
#pragma once
#include <cstdint>

namespace lode::quant {

#define LODE_DECLARE_DEQUANTIZE(name) void dequantize_row_##name(const void* src, float* dst, int64_t n);
#define LODE_DECLARE_QUANTIZE(name) void quantize_row_##name(const float* src, void* dst, int64_t n);

// float formats (float.cpp)
LODE_DECLARE_DEQUANTIZE(f32) LODE_DECLARE_DEQUANTIZE(f16) LODE_DECLARE_DEQUANTIZE(bf16)
LODE_DECLARE_QUANTIZE(f32) LODE_DECLARE_QUANTIZE(f16) LODE_DECLARE_QUANTIZE(bf16)
// lookup-table 4-bit formats (iq4.cpp): iq4_nl, iq4_xs, mxfp4
LODE_DECLARE_DEQUANTIZE(mxfp4)
// 32-value blocks (legacy.cpp)
LODE_DECLARE_DEQUANTIZE(q4_0) LODE_DECLARE_DEQUANTIZE(q4_1) LODE_DECLARE_DEQUANTIZE(q5_0)
LODE_DECLARE_DEQUANTIZE(q5_1) LODE_DECLARE_DEQUANTIZE(q8_0)
LODE_DECLARE_QUANTIZE(q4_0) LODE_DECLARE_QUANTIZE(q4_1) LODE_DECLARE_QUANTIZE(q5_0)
LODE_DECLARE_QUANTIZE(q5_1) LODE_DECLARE_QUANTIZE(q8_0)
// k-quants (kquants.cpp; quantizers in kquants_quantize.cpp)
LODE_DECLARE_DEQUANTIZE(q2_K) LODE_DECLARE_DEQUANTIZE(q3_K) LODE_DECLARE_DEQUANTIZE(q4_K)
LODE_DECLARE_DEQUANTIZE(q5_K) LODE_DECLARE_DEQUANTIZE(q6_K)
LODE_DECLARE_QUANTIZE(q4_K) LODE_DECLARE_QUANTIZE(q5_K) LODE_DECLARE_QUANTIZE(q6_K)
// non-linear 4-bit (iq4.cpp; quantizers in iq4_quantize.cpp)
LODE_DECLARE_DEQUANTIZE(iq4_nl) LODE_DECLARE_DEQUANTIZE(iq4_xs)
LODE_DECLARE_QUANTIZE(iq4_nl) LODE_DECLARE_QUANTIZE(iq4_xs)
// grid i-quants (iquants.cpp, grids in iq_grids.cpp)
LODE_DECLARE_DEQUANTIZE(iq2_xxs) LODE_DECLARE_DEQUANTIZE(iq2_xs) LODE_DECLARE_DEQUANTIZE(iq2_s)
LODE_DECLARE_DEQUANTIZE(iq3_xxs) LODE_DECLARE_DEQUANTIZE(iq3_s)
LODE_DECLARE_DEQUANTIZE(iq1_s) LODE_DECLARE_DEQUANTIZE(iq1_m)

#undef LODE_DECLARE_DEQUANTIZE
#undef LODE_DECLARE_QUANTIZE

}  // namespace lode::quant
