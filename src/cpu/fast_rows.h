// Faster row decoders for the types that dominate a qwen35moe forward pass (q8_0 trunk
// projections, q4_K / q5_K / q5_0 experts, q6_K embeddings and lm head). Each gives exactly the
// floats of the reference converter in core/quant (same float operations in the same order,
// checked by tests/test_cpu_layers.cpp): portable loops written so the compiler can vectorize them,
// built for AVX2 as well as the baseline (picked at run time), and AVX2 intrinsics for q8_0, q4_K,
// q5_K, q6_K and q5_0 (cpu/fast_rows_avx2.cpp), 1.2 to 7 times faster, where the host has AVX2. No
// FMA, so nothing is contracted. (f16 rows: core/quant's own converter, F16C where the host has it.)
#pragma once
#include "core/quant/types.h"

namespace lode::cpu {

// Which decoders to pick from: the best this host runs, or only the portable ones (tests compare
// both against the reference).
enum class Decoders { host, portable };

// The fast decoder of `type`, or the reference one (traits(type).dequantize) when there is none.
DequantizeRow row_decoder(GgmlType type, Decoders decoders = Decoders::host);

}  // namespace lode::cpu
