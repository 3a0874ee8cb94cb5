// Weights dequantized to float32 on the GPU, for the prompt path: a chunk of prompt tokens
// multiplies whole matrices (tensor cores through cuBLAS), so the weights stored quantized are
// expanded once per chunk into scratch, instead of once per token inside a matrix-vector kernel.
// Values are those of lode's CPU dequantizers (the same formulas in the same order). No CUDA types
// here, so host C++ compiled by g++ can call it.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/quant/types.h"
#include "cuda/weight_types.h"  // expandable(): the types and widths dequantize() takes

namespace lode::cuda {

// n_matrices matrices of rows x cols into out [n_matrices][rows][cols]: matrix m is the one at
// table[ids[m]] (ids null: table[m]); with table null, w's ids[m]-th matrix of `rows` rows (rows 1:
// an embedding table's rows looked up by token; ids null: its m-th, so w itself for one). A negative
// id gives zeros. Rows are row_bytes apart; cols a multiple of 32. Returns null when queued, else the
// CUDA runtime's message.
const char* dequantize(GgmlType type, const void* w, const void* const* table, const int32_t* ids,
                       int64_t n_matrices, int64_t rows, int64_t cols, size_t row_bytes, float* out, void* stream);

}  // namespace lode::cuda
