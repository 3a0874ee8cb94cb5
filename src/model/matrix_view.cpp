#include "model/matrix_view.h"

#include "core/error.h"

namespace lode::model {

void dequantize_row(const MatrixView& w, int64_t r, float* out) {
  if (w.type == nullptr || w.data == nullptr) fail("weights: the matrix is not bound");
  if (w.type->dequantize == nullptr)
    fail("weights of type {} cannot be read by lode", w.type->name);
  if (r < 0 || r >= w.rows) fail("weights: row {} out of range [0, {})", r, w.rows);
  w.type->dequantize(w.row(r), out, w.cols);
}

}  // namespace lode::model
