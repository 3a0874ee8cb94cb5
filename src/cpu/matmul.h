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
#include "model/matrix_view.h"

namespace lode::cpu {

// Dot product of two float vectors with a fixed summation order (8 interleaved partial sums).
float dot(const float* a, const float* b, int64_t n);

// dot(a[r], b, n) into out[r] for four rows, bit for bit, faster (AVX2 where the host has it).
void dot4(const float* const a[4], const float* b, int64_t n, float out[4]);

// Y[t, r] = sum_c W[r, c] * X[t, c] for t in [0, n_tokens): X is [n_tokens, W.cols] row-major,
// Y is [n_tokens, W.rows] row-major. Parallel over weight rows on compute.threads OpenMP threads;
// with Activations::q8 each row of X is first rounded as ggml's CPU path would for W's type.
// Fails when W's type cannot be dequantized.
void matmul(const model::MatrixView& w, const float* x, float* y, int64_t n_tokens, const Compute& compute);

// Row r of W as float32 into out[0, W.cols) (used for embedding lookups).
void dequantize_row(const model::MatrixView& w, int64_t r, float* out);

}  // namespace lode::cpu
