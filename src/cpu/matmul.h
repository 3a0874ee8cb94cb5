// Products of float32 activations with weights stored in any ggml type, computed straight from the
// quantized rows: each weight row is dequantized once into a per-thread buffer and dotted with every
// activation row. The dot product of one weight row with one activation row is always computed the
// same way (same order of float operations), whatever the number of activation rows or threads, so
// a prompt run in chunks gives bit-identical results to the same prompt run token by token.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/quant/types.h"
#include "cpu/compute.h"

namespace lode::cpu {

// A 2-D weight matrix in ggml layout: `rows` rows of `cols` values each (ggml ne[0] = cols,
// ne[1] = rows), row r at data + r * row_bytes. y = W x computes one output per row.
struct MatrixView {
  const TypeTraits* type = nullptr;
  const uint8_t* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  size_t row_bytes = 0;

  bool empty() const { return data == nullptr; }
  const uint8_t* row(int64_t r) const { return data + size_t(r) * row_bytes; }
};

// Dot product of two float vectors with a fixed summation order (8 interleaved partial sums).
float dot(const float* a, const float* b, int64_t n);

// Y[t, r] = sum_c W[r, c] * X[t, c] for t in [0, n_tokens): X is [n_tokens, W.cols] row-major,
// Y is [n_tokens, W.rows] row-major. Parallel over weight rows on compute.threads OpenMP threads;
// with Activations::q8 each row of X is first rounded as ggml's CPU path would for W's type.
// Fails when W's type cannot be dequantized.
void matmul(const MatrixView& w, const float* x, float* y, int64_t n_tokens, const Compute& compute);

// Row r of W as float32 into out[0, W.cols) (used for embedding lookups).
void dequantize_row(const MatrixView& w, int64_t r, float* out);

}  // namespace lode::cpu
