// SCAFFOLDING ONLY, deleted before the foundation issue lands: converters not written yet.
// Whoever implements a converter deletes its line here (the linker reports duplicates).
#include "core/error.h"
#include "core/quant/dequant.h"
namespace lode::quant {
void dequantize_row_q2_K(const void*, float*, int64_t) { fail("q2_K: dequantize pending"); }
void dequantize_row_q3_K(const void*, float*, int64_t) { fail("q3_K: dequantize pending"); }
void dequantize_row_q4_K(const void*, float*, int64_t) { fail("q4_K: dequantize pending"); }
void dequantize_row_q5_K(const void*, float*, int64_t) { fail("q5_K: dequantize pending"); }
void dequantize_row_q6_K(const void*, float*, int64_t) { fail("q6_K: dequantize pending"); }
void quantize_row_q4_K(const float*, void*, int64_t) { fail("q4_K: quantize pending"); }
void quantize_row_q5_K(const float*, void*, int64_t) { fail("q5_K: quantize pending"); }
void quantize_row_q6_K(const float*, void*, int64_t) { fail("q6_K: quantize pending"); }
}  // namespace lode::quant
