// The activation rounding of Activations::q8: what ggml's CPU matrix product does to a float32
// activation row before multiplying it with a weight row of a given type (its "vec_dot type").
//   Q8_0 (blocks of 32): d = max|x| / 127 stored as fp16, q = round(x * 127 / max|x|);
//   Q8_K (blocks of 256): m = the value of largest magnitude, q = min(127, round(-127 x / m)),
//                          d = -m / 127 as float32;
//   F16 / BF16: each value rounded to that format.
// The rounded row is d * q (or the half value) in float32, so a float dot product with the
// dequantized weight row equals ggml's integer dot product up to summation order.
#pragma once
#include <cstdint>

#include "core/quant/types.h"

namespace lode::cpu {

// The type ggml's CPU path converts activations to for weights of type `weight` (F32: none).
GgmlType activation_type_for(GgmlType weight);
// out[0, n) = x[0, n) rounded to activation_type_for(weight); n is a whole number of its blocks
// (weight rows always are). out may be x.
void round_activations(GgmlType weight, const float* x, float* out, int64_t n);

}  // namespace lode::cpu
