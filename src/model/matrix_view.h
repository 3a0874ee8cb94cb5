// A weight matrix as the file stores it, for any engine: its ggml type, its bytes (inside the
// reader's read-only mapping) and its shape.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/quant/types.h"

namespace lode::model {

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

// Whether two matrices have one type and one shape (a product can take both in one launch).
inline bool same_shape(const MatrixView& a, const MatrixView& b) {
  return a.type == b.type && a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes;
}

// Row r of W as float32 into out[0, W.cols), by the type's reference decoder (core/quant), e.g. an
// embedding lookup. Fails when the type cannot be read or r is out of range.
void dequantize_row(const MatrixView& w, int64_t r, float* out);

}  // namespace lode::model
