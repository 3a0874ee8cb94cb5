// The fast kernels behind q8twin::rows (cpu/q8_twin.h): the same bits as q8twin::row_dot, with
// SIMD integer dot products, for the types and row lengths they cover. Internal to cpu/q8_twin.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/quant/types.h"
#include "cpu/q8_twin.h"

namespace lode::cpu::q8twin::fast {

// y[r] for rows [0, rows) of the matrix at w, row_bytes apart.
using RowsKernel = void (*)(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols, const RoundedX& x,
                            float* y);

// The instruction set the fast kernels use, for logs.
extern const char* const kIsaName;

// The fast kernel for `type` rows of `cols` values on this host, or null (q8twin::rows then uses
// row_dot).
RowsKernel kernel_for(GgmlType type, int64_t cols);

}  // namespace lode::cpu::q8twin::fast
