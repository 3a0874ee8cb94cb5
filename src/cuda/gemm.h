// Matrix products for the prompt path, through cuBLAS, in row-major terms. Float32 data; the
// precision of the multiply is chosen per session: TF32 tensor cores (inputs rounded to 10-bit
// mantissas, float32 sums; the default for prompts) or full float32 (slower, within float
// rounding of the decode path; tests compare the two paths with it).
#pragma once
#include <cstdint>

namespace lode::cuda {

enum class PromptMath { tf32, fp32 };

class Gemm {
 public:
  Gemm(PromptMath math, void* stream);  // stream: a cudaStream_t
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Y[rows, n] = X[rows, k] * W[n, k]^T. Leading dimensions are the distances between consecutive
  // rows, in floats. `exact`: float32 whatever the session's math (the router: a rounding there
  // can change which experts a token reaches).
  void xwt(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t rows, int64_t n,
           int64_t k, bool exact = false) const;

  // `batch` products Y_b[rows, n] = X_b[rows, k] * W_b[n, k]^T with X_b = x + b * x_stride etc.
  void xwt_batched(const float* x, int64_t ldx, int64_t x_stride, const float* w, int64_t ldw, int64_t w_stride,
                   float* y, int64_t ldy, int64_t y_stride, int64_t rows, int64_t n, int64_t k, int64_t batch) const;

  // `batch` products Y_b[rows, n] = X_b[rows, k] * W_b[k, n] (W not transposed).
  void xw_batched(const float* x, int64_t ldx, int64_t x_stride, const float* w, int64_t ldw, int64_t w_stride,
                  float* y, int64_t ldy, int64_t y_stride, int64_t rows, int64_t n, int64_t k, int64_t batch) const;

 private:
  void* handle_ = nullptr;
  PromptMath math_;
};

}  // namespace lode::cuda
