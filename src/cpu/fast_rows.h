// Faster row decoders for the types that dominate a qwen35moe forward pass (q8_0 trunk
// projections, q4_K / q5_K experts, q6_K embeddings and lm head). Each gives exactly the floats
// of the reference converter in core/quant (same float operations in the same order, checked by
// tests/test_cpu_layers.cpp), written so the compiler can vectorize it, and built for AVX2 as
// well as the baseline (picked at run time), without FMA so nothing is contracted.
#pragma once
#include "core/quant/types.h"

namespace lode::cpu {

// The fast decoder of `type`, or the reference one (traits(type).dequantize) when there is none.
DequantizeRow row_decoder(GgmlType type);

}  // namespace lode::cpu
