// Quantized matrix-vector products on the GPU, reading the weights as stored in the GGUF file (no
// dequantized copies): y[t, r] = sum_c W[r, c] * x[t, c]. One warp per weight row; each lane
// dequantizes 32-value units of the row in registers and dots them with x; the warp reduces.
// This is the decode path's first, plain form (issue 7): correct for every supported type, not yet
// tuned (no 16-byte loads, x not staged in shared memory, one token per grid row).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/quant/types.h"

namespace lode::cuda {

// Whether a kernel exists for weights of this type.
bool has_matvec(GgmlType type);

// W: `rows` rows of `cols` values stored as `type`, row r at w + r * row_bytes; x: [n_tokens, cols];
// y: [n_tokens, rows]; all device memory. Queued on `stream` (a cudaStream_t; null: the default
// stream). Fails (lode::Error) for a type without a kernel. Plain float rows may have any length
// (a slower path when it is not a multiple of 32); quantized rows are whole blocks by construction.
//
// swiglu_up > 0 (matvec and grouped_matvec): the product's input is not x but silu(x[c]) *
// x[swiglu_up + c], a SwiGLU's gate and up halves, applied while x is read (no separate pass).
void matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, size_t row_bytes, const float* x,
            float* y, int64_t n_tokens, void* stream = nullptr, int64_t swiglu_up = 0);

// Several products in one launch, each with its own matrix from a device-side table (the MoE's
// (layer, expert) -> weights table; an expert cache can move experts without touching kernels):
// problem p multiplies the matrix at table[ids[p]] (rows x cols, `type`) with x + p * x_stride
// (x_stride 0: all problems share one x) into y + p * rows. table, ids, x and y are device memory.
void grouped_matvec(GgmlType type, const void* const* table, const int32_t* ids, int64_t n_problems, int64_t rows,
                    int64_t cols, size_t row_bytes, const float* x, int64_t x_stride, float* y, void* stream = nullptr,
                    int64_t swiglu_up = 0);

}  // namespace lode::cuda
