#include "cuda/gemm.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "cuda/errors.h"

namespace lode::cuda {

namespace {

cublasHandle_t as_handle(void* h) { return static_cast<cublasHandle_t>(h); }
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: {}: {}", what, cublasGetStatusString(status));
}

cublasComputeType_t compute(PromptMath math) {
  return math == PromptMath::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

// Every lane's workspace: what cuBLAS recommends for Hopper (and keeps by default there), so that
// lane 0 picks the algorithms a handle of its own would.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

}  // namespace

Gemm::Gemm(PromptMath math, void* stream, int lanes) : math_(math) {
  if (lanes < 1) fail("cuBLAS: a Gemm of {} lanes", lanes);
  try {
    check_cuda(cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(&forked_), cudaEventDisableTiming), "an event");
    for (int l = 0; l < lanes; ++l) {
      Lane& lane = lanes_.emplace_back();
      if (l == 0) {
        lane.stream = stream;
      } else {
        cudaStream_t s = nullptr;
        check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "a stream for a lane of products");
        lane.stream = s;
      }
      cublasHandle_t handle = nullptr;
      check(cublasCreate(&handle), "creating a handle");
      lane.handle = handle;
      check_cuda(cudaMalloc(&lane.workspace, kWorkspaceBytes), "a cuBLAS workspace");
      check_cuda(cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(&lane.done), cudaEventDisableTiming), "an event");
      check(cublasSetStream(handle, as_stream(lane.stream)), "setting the stream");
      check(cublasSetWorkspace(handle, lane.workspace, kWorkspaceBytes), "setting the workspace");
    }
  } catch (...) {
    release();
    throw;
  }
}

Gemm::~Gemm() { release(); }

void Gemm::release() {
  for (size_t l = 0; l < lanes_.size(); ++l) {
    Lane& lane = lanes_[l];
    if (lane.handle) cublasDestroy(as_handle(lane.handle));
    if (lane.workspace) cudaFree(lane.workspace);
    if (lane.done) cudaEventDestroy(as_event(lane.done));
    if (l > 0 && lane.stream) cudaStreamDestroy(as_stream(lane.stream));
  }
  lanes_.clear();
  if (forked_) cudaEventDestroy(as_event(forked_));
  forked_ = nullptr;
}

void Gemm::fork() const {
  if (lanes_.size() < 2) return;
  check_cuda(cudaEventRecord(as_event(forked_), as_stream(lanes_[0].stream)), "forking the products' lanes");
  for (size_t l = 1; l < lanes_.size(); ++l)
    check_cuda(cudaStreamWaitEvent(as_stream(lanes_[l].stream), as_event(forked_)), "forking the products' lanes");
}

void Gemm::join() const {
  for (size_t l = 1; l < lanes_.size(); ++l) {
    check_cuda(cudaEventRecord(as_event(lanes_[l].done), as_stream(lanes_[l].stream)), "joining the products' lanes");
    check_cuda(cudaStreamWaitEvent(as_stream(lanes_[0].stream), as_event(lanes_[l].done)), "joining the products' lanes");
  }
}

// cuBLAS is column-major: a row-major [rows, k] matrix with leading dimension ld is its transpose
// there. Y = X W^T in row-major is Y^T = W X^T in column-major: A = W (stored [n, k], so op T),
// B = X^T (op N), C = Y^T.
void Gemm::xwt(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t rows,
               int64_t n, int64_t k, bool exact, int lane) const {
  if (rows == 0 || n == 0) return;
  if (lane < 0 || lane >= lanes()) fail("cuBLAS: lane {} of a Gemm of {}", lane, lanes());
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasGemmEx(as_handle(lanes_[size_t(lane)].handle), CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(rows), int(k),
                     &alpha, w, CUDA_R_32F, int(ldw), x, CUDA_R_32F, int(ldx), &beta, y, CUDA_R_32F, int(ldy),
                     compute(exact ? PromptMath::fp32 : math_), CUBLAS_GEMM_DEFAULT),
        "a matrix product");
}

void Gemm::xwt_batched(const float* x, int64_t ldx, int64_t x_stride, const float* w, int64_t ldw, int64_t w_stride,
                       float* y, int64_t ldy, int64_t y_stride, int64_t rows, int64_t n, int64_t k,
                       int64_t batch) const {
  if (rows == 0 || n == 0 || batch == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasGemmStridedBatchedEx(as_handle(handle()), CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(rows), int(k), &alpha, w,
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
  check(cublasGemmStridedBatchedEx(as_handle(handle()), CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(rows), int(k), &alpha, w,
                                   CUDA_R_32F, int(ldw), w_stride, x, CUDA_R_32F, int(ldx), x_stride, &beta, y,
                                   CUDA_R_32F, int(ldy), y_stride, int(batch), compute(math_), CUBLAS_GEMM_DEFAULT),
        "a batched matrix product");
}

}  // namespace lode::cuda
