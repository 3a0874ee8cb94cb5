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

bool Gemm::xwt_grouped(const std::vector<int>& rows, int64_t n, int64_t k, const float* const* w, int64_t ldw,
                       const float* const* x, int64_t ldx, float* const* y, int64_t ldy) const {
  if (rows.empty()) return true;
  const size_t groups = rows.size();
  const std::vector<cublasOperation_t> op_w(groups, CUBLAS_OP_T), op_x(groups, CUBLAS_OP_N);
  const std::vector<int> ms(groups, int(n)), ks(groups, int(k)), lda(groups, int(ldw)), ldb(groups, int(ldx)),
      ldc(groups, int(ldy)), sizes(groups, 1);
  const std::vector<float> alpha(groups, 1.0f), beta(groups, 0.0f);
  const cublasStatus_t status = cublasGemmGroupedBatchedEx(
      as_handle(handle_), op_w.data(), op_x.data(), ms.data(), rows.data(), ks.data(), alpha.data(),
      reinterpret_cast<const void* const*>(w), CUDA_R_32F, lda.data(), reinterpret_cast<const void* const*>(x),
      CUDA_R_32F, ldb.data(), beta.data(), reinterpret_cast<void* const*>(y), CUDA_R_32F, ldc.data(), int(groups),
      sizes.data(), compute(math_));
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  check(status, "a grouped matrix product");
  return true;
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
