// Matrix products for the prompt path, through cuBLAS, in row-major terms. Float32 data; the
// precision of the multiply is chosen per session: TF32 tensor cores (inputs rounded to 10-bit
// mantissas, float32 sums; the default for prompts) or full float32 (slower, within float
// rounding of the decode path; tests compare the two paths with it).
//
// Lanes: products that read and write nothing of each other's (a pass's pieces, each on its own
// rows) may run side by side, lane l's on a stream of its own between fork() and join(). Each lane
// has its own cuBLAS handle and workspace, all of one size, so cuBLAS picks the same algorithm for
// a shape on every lane (its results are reproducible per handle and workspace, not across
// streams sharing one) and a product gets the bits it gets on lane 0 alone.
#pragma once
#include <cstdint>
#include <vector>

namespace lode::cuda {

enum class PromptMath { tf32, fp32 };

class Gemm {
 public:
  // stream: a cudaStream_t, lane 0's; lanes - 1 more streams are made.
  Gemm(PromptMath math, void* stream, int lanes = 1);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  int lanes() const { return int(lanes_.size()); }
  // Lanes 1.. start after what lane 0's stream holds now; join() makes lane 0's stream wait for
  // what they were given since.
  void fork() const;
  void join() const;

  // Y[rows, n] = X[rows, k] * W[n, k]^T. Leading dimensions are the distances between consecutive
  // rows, in floats. `exact`: float32 whatever the session's math (the router: a rounding there
  // can change which experts a token reaches). On `lane` (0 outside fork() .. join()).
  void xwt(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t rows, int64_t n,
           int64_t k, bool exact = false, int lane = 0) const;

  // `batch` products Y_b[rows, n] = X_b[rows, k] * W_b[n, k]^T with X_b = x + b * x_stride etc.
  void xwt_batched(const float* x, int64_t ldx, int64_t x_stride, const float* w, int64_t ldw, int64_t w_stride,
                   float* y, int64_t ldy, int64_t y_stride, int64_t rows, int64_t n, int64_t k, int64_t batch) const;

  // `batch` products Y_b[rows, n] = X_b[rows, k] * W_b[k, n] (W not transposed).
  void xw_batched(const float* x, int64_t ldx, int64_t x_stride, const float* w, int64_t ldw, int64_t w_stride,
                  float* y, int64_t ldy, int64_t y_stride, int64_t rows, int64_t n, int64_t k, int64_t batch) const;

 private:
  struct Lane {
    void* handle = nullptr;     // cublasHandle_t
    void* stream = nullptr;     // cudaStream_t (lane 0's is the caller's)
    void* workspace = nullptr;  // device memory
    void* done = nullptr;       // cudaEvent_t: its work since fork()
  };
  void* handle() const { return lanes_.front().handle; }
  void release();
  std::vector<Lane> lanes_;
  void* forked_ = nullptr;  // cudaEvent_t: lane 0's work before fork()
  PromptMath math_;
};

}  // namespace lode::cuda
