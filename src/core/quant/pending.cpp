// SCAFFOLDING ONLY, deleted before the foundation issue lands: converters not written yet.
// Whoever implements a converter deletes its line here (the linker reports duplicates).
#include "core/error.h"
#include "core/quant/dequant.h"
namespace lode::quant {
void dequantize_row_f32(const void*, float*, int64_t) { fail("f32: dequantize pending"); }
void dequantize_row_f16(const void*, float*, int64_t) { fail("f16: dequantize pending"); }
void dequantize_row_bf16(const void*, float*, int64_t) { fail("bf16: dequantize pending"); }
void dequantize_row_mxfp4(const void*, float*, int64_t) { fail("mxfp4: dequantize pending"); }
void dequantize_row_q4_0(const void*, float*, int64_t) { fail("q4_0: dequantize pending"); }
void dequantize_row_q4_1(const void*, float*, int64_t) { fail("q4_1: dequantize pending"); }
void dequantize_row_q5_0(const void*, float*, int64_t) { fail("q5_0: dequantize pending"); }
void dequantize_row_q5_1(const void*, float*, int64_t) { fail("q5_1: dequantize pending"); }
void dequantize_row_q8_0(const void*, float*, int64_t) { fail("q8_0: dequantize pending"); }
void dequantize_row_q2_K(const void*, float*, int64_t) { fail("q2_K: dequantize pending"); }
void dequantize_row_q3_K(const void*, float*, int64_t) { fail("q3_K: dequantize pending"); }
void dequantize_row_q4_K(const void*, float*, int64_t) { fail("q4_K: dequantize pending"); }
void dequantize_row_q5_K(const void*, float*, int64_t) { fail("q5_K: dequantize pending"); }
void dequantize_row_q6_K(const void*, float*, int64_t) { fail("q6_K: dequantize pending"); }
void dequantize_row_iq4_nl(const void*, float*, int64_t) { fail("iq4_nl: dequantize pending"); }
void dequantize_row_iq4_xs(const void*, float*, int64_t) { fail("iq4_xs: dequantize pending"); }
void dequantize_row_iq2_xxs(const void*, float*, int64_t) { fail("iq2_xxs: dequantize pending"); }
void dequantize_row_iq2_xs(const void*, float*, int64_t) { fail("iq2_xs: dequantize pending"); }
void dequantize_row_iq2_s(const void*, float*, int64_t) { fail("iq2_s: dequantize pending"); }
void dequantize_row_iq3_xxs(const void*, float*, int64_t) { fail("iq3_xxs: dequantize pending"); }
void dequantize_row_iq3_s(const void*, float*, int64_t) { fail("iq3_s: dequantize pending"); }
void dequantize_row_iq1_s(const void*, float*, int64_t) { fail("iq1_s: dequantize pending"); }
void dequantize_row_iq1_m(const void*, float*, int64_t) { fail("iq1_m: dequantize pending"); }
void quantize_row_f32(const float*, void*, int64_t) { fail("f32: quantize pending"); }
void quantize_row_f16(const float*, void*, int64_t) { fail("f16: quantize pending"); }
void quantize_row_bf16(const float*, void*, int64_t) { fail("bf16: quantize pending"); }
void quantize_row_q4_0(const float*, void*, int64_t) { fail("q4_0: quantize pending"); }
void quantize_row_q8_0(const float*, void*, int64_t) { fail("q8_0: quantize pending"); }
void quantize_row_q4_K(const float*, void*, int64_t) { fail("q4_K: quantize pending"); }
void quantize_row_q5_K(const float*, void*, int64_t) { fail("q5_K: quantize pending"); }
void quantize_row_q6_K(const float*, void*, int64_t) { fail("q6_K: quantize pending"); }
void quantize_row_iq4_nl(const float*, void*, int64_t) { fail("iq4_nl: quantize pending"); }
void quantize_row_iq4_xs(const float*, void*, int64_t) { fail("iq4_xs: quantize pending"); }
}  // namespace lode::quant
