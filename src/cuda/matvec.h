// Quantized matrix-vector products on the GPU, reading the weights as stored in the GGUF file (no
// dequantized copies): y[t, r] = sum_c W[r, c] * x[t, c]. One warp (or, for short rows, a group of
// lanes) per weight row; lanes dequantize their part of the row in registers and dot it with x.
// Two forms: float32 x for every type (cuda/matvec_kernels.cu), and 8-bit x with integer dot
// products for the types decode reads most (MatvecInput::q8, cuda/matvec_q8_kernels.cu).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/quant/types.h"
#include "cuda/matvec_launch.h"

namespace lode::cuda {

// How a product reads x (and where several problems write y).
struct MatvecInput {
  // > 0: the input is not x but silu(x[c]) * x[swiglu_up + c], a SwiGLU's gate and up halves,
  // applied while x is read (no separate pass).
  int64_t swiglu_up = 0;
  // Round x to 8 bits first, as ggml's CPU path (and lode's CPU engine with Activations::q8) does
  // for the weight's type, and multiply in integers (dp4a): Q8_0, Q5_0, Q4_K, Q5_K and Q6_K weights.
  // Other types multiply float32 x either way.
  bool q8 = false;
  // Grouped q8 products only (MatvecLaunch's fields of the same names).
  L2Ahead ahead{};
  bool ids_before_wait = false;
  // Several problems (inputs, or a grouped product's problems): runs of x_run consecutive problems
  // share one x, and the inputs start again after x_inputs of them (0: never), as ProblemIo counts
  // them; problem p's outputs at y + p * y_stride (0: rows apart). A verify window's T rows, each
  // with its k experts: x_run k, x_inputs T.
  int32_t x_run = 1, x_inputs = 0;
  int64_t y_stride = 0;
  // Grouped q8 products (has_q8_matvec types): the problems are these groups (MatvecLaunch::groups)
  // instead of ids: pair p's x at x + (p / x_run) * x_stride, its y at y + p * y_stride.
  const ExpertGroup* groups = nullptr;
  int32_t group_inputs = kGroupInputs;  // the most pairs a group has (a step's rows, up to 8)
  // Grouped products: part q of group_parts (a gate|up table's gates, then its ups) reads the
  // matrix at table[q * part_entries + id] and writes its pairs' outputs q * n_problems pairs on.
  int32_t group_parts = 1;
  int64_t part_entries = 0;
  // 8-bit products of several inputs of one matrix, grouped ones, and those from a table whose
  // problems share inputs (more than one input and fewer than the problems, as ProblemIo::inputs
  // counts them: a window's experts, the shared expert's gate|up over a window): device scratch
  // where each input is rounded once before the product (MatvecLaunch::rounded;
  // rounded_inputs_bytes says how much a launch needs, and a launch without enough fails saying so).
  void* rounded = nullptr;
  size_t rounded_bytes = 0;
};
bool has_q8_matvec(GgmlType type);

// Whether a kernel exists for weights of this type.
bool has_matvec(GgmlType type);

// W: `rows` rows of `cols` values stored as `type`, row r at w + r * row_bytes; x: [n_tokens, cols];
// y: [n_tokens, rows]; all device memory. With 8-bit x and a type with integer kernels (Q8_0, Q5_0,
// the K-quants) the matrix is read once for up to 8 tokens (fewer where their rounded x would not
// fit in shared memory), from 16 tokens on the tensor cores 16 at a time (Q8_0 rows of 256 values
// and more, the K-quants), each token's products the bits it gets alone; several tokens are
// rounded once each into input.rounded first. Queued on `stream` (a cudaStream_t; null: the
// default stream). Fails (lode::Error) for a type without a kernel. Plain float rows may have any length
// (a slower path when it is not a multiple of 32); quantized rows are whole blocks by construction.
void matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, size_t row_bytes, const float* x,
            float* y, int64_t n_tokens, void* stream = nullptr, MatvecInput input = {});

// Several products in one launch, each with its own matrix from a device-side table (the MoE's
// (layer, expert) -> weights table; an expert cache can move experts without touching kernels):
// problem p multiplies the matrix at table[ids[p]] (rows x cols, `type`) with x + p * x_stride
// (x_stride 0: all problems share one x; input's x_run and x_inputs regroup them) into y + p * rows.
// table, ids, x and y are device memory. With 8-bit x and problems that share inputs, the inputs
// are rounded once into input.rounded first (a launch without that scratch fails, saying so).
void grouped_matvec(GgmlType type, const void* const* table, const int32_t* ids, int64_t n_problems, int64_t rows,
                    int64_t cols, size_t row_bytes, const float* x, int64_t x_stride, float* y, void* stream = nullptr,
                    MatvecInput input = {});

}  // namespace lode::cuda
