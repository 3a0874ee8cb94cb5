#include "cuda/matvec.h"

#include "core/error.h"
#include "cuda/matvec_launch.h"

namespace lode::cuda {

bool has_matvec(GgmlType type) { return matvec_kernel_exists(type); }

void matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, size_t row_bytes, const float* x, float* y,
            int64_t n_tokens, void* stream) {
  if (!has_matvec(type))
    fail("the CUDA backend has no kernel for {} weights yet; requantize the model (lode quantize --recipe "
         "ud-q4_k_xl) or run it on the CPU", traits(type).name);
  if (cols % 32 != 0) fail("cuda matvec: rows of {} values are not whole units of 32", cols);
  if (rows <= 0 || n_tokens <= 0) return;
  if (n_tokens > 65535) fail("cuda matvec: {} tokens in one launch; at most 65535", n_tokens);
  if (const char* err = launch_matvec({type, w, rows, cols, row_bytes, x, y, n_tokens, stream}))
    fail("CUDA: matvec on {} weights ({} x {}): {}", traits(type).name, rows, cols, err);
}

}  // namespace lode::cuda
