#include "cuda/gemm.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace lode::cuda {

namespace {

cublasHandle_t as_handle(void* h) { return static_cast<cublasHandle_t>(h); }

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: {}: {}", what, cublasGetStatusString(status));
}

cublasComputeType_t compute(PromptMath math) {
  return math == PromptMath::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

}  // namespace

Gemm::Gemm(PromptMath math, void* stream) : math_(math) {
  cublasHandle_t handle = nullptr;
  check(cublasCreate(&handle), "creating a handle");
  handle_ = handle;
  check(cublasSetStream(handle, static_cast<cudaStream_t>(stream)), "setting the stream");
}

Gemm::~Gemm() {
  if (handle_) cublasDestroy(as_handle(handle_));
}

// cuBLAS is column-major: a row-major [rows, k] matrix with leading dimension ld is its transpose
// there. Y = X W^T in row-major is Y^T = W X^T in column-major: A = W (stored [n, k], so op T),
// B = X^T (op N), C = Y^T.
void Gemm::xwt(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t rows,
               int64_t n, int64_t k, bool exact) const {
  if (rows == 0 || n == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasGemmEx(as_handle(handle_), CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(rows), int(k), &alpha, w, CUDA_R_32F,
                     int(ldw), x, CUDA_R_32F, int(ldx), &beta, y, CUDA_R_32F, int(ldy),
                     compute(exact ? PromptMath::fp32 : math_), CUBLAS_GEMM_DEFAULT),
        "a matrix product");
}

void Gemm::xwt_batched(const float* x, int64_t ldx, int64_t x_stride, const float* w, int64_t ldw, int64_t w_stride,
                       float* y, int64_t ldy, int64_t y_stride, int64_t rows, int64_t n, int64_t k,
                       int64_t batch) const {
  if (rows == 0 || n == 0 || batch == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasGemmStridedBatchedEx(as_handle(handle_), CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(rows), int(k), &alpha, w,
                                   CUDA_R_32F, int(ldw), w_stride, x, CUDA_R_32F, int(ldx), x_stride, &beta, y,
                                   CUDA_R_32F, int(ldy), y_stride, int(batch), compute(math_), CUBLAS_GEMM_DEFAULT),
        "a batched matrix product");
}

// Y = X W with W stored [k, n]: column-major Y^T = W^T X^T, and W^T is W's storage read as is.
void Gemm::xw_batched(const float* x, int64_t ldx, int64_t x_stride, const float* w, int64_t ldw, int64_t w_stride,
                      float* y, int64_t ldy, int64_t y_stride, int64_t rows, int64_t n, int64_t k,
                      int64_t batch) const {
  if (rows == 0 || n == 0 || batch == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasGemmStridedBatchedEx(as_handle(handle_), CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(rows), int(k), &alpha, w,
                                   CUDA_R_32F, int(ldw), w_stride, x, CUDA_R_32F, int(ldx), x_stride, &beta, y,
                                   CUDA_R_32F, int(ldy), y_stride, int(batch), compute(math_), CUBLAS_GEMM_DEFAULT),
        "a batched matrix product");
}

}  // namespace lode::cuda
