// Naive double-precision building blocks the layer tests write their references with.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/quant/types.h"
#include "cpu/matmul.h"

namespace lode::test {

using Vec = std::vector<double>;
using lode::model::MatrixView;

// A float32 matrix of `rows` rows of `cols` values.
inline MatrixView f32_view(const std::vector<float>& w, int64_t rows, int64_t cols) {
  EXPECT_EQ(int64_t(w.size()), rows * cols);
  return MatrixView{&lode::traits(lode::GgmlType::F32), reinterpret_cast<const uint8_t*>(w.data()),
                    cols, rows, size_t(cols) * sizeof(float)};
}

inline Vec mat_vec(const std::vector<float>& w, int64_t rows, int64_t cols, const float* x) {
  Vec y(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) y[r] += double(w[r * cols + c]) * x[c];
  return y;
}
inline Vec mat_vec(const std::vector<float>& w, int64_t rows, int64_t cols, const Vec& x) {
  std::vector<float> xf(x.begin(), x.end());
  return mat_vec(w, rows, cols, xf.data());
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu(double x) { return x * sigmoid(x); }

inline void rms_norm(double* x, int64_t n, const float* w, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double scale = 1.0 / std::sqrt(ss / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * scale * w[i];
}

// max |got - want| over max |want| (want in float or double); infinite when the sizes differ, so
// that a bound on it fails.
template <class Want>
double relative_error(const std::vector<float>& got, const std::vector<Want>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  return diff / scale;
}

// Rotates pairs (i, i + rot/2) of a head vector by pos * theta^(-2i/rot).
inline void naive_rope(double* x, int64_t rot, int64_t pos, double theta) {
  for (int64_t i = 0; i < rot / 2; ++i) {
    const double angle = double(pos) / std::pow(theta, 2.0 * double(i) / double(rot));
    const double a = x[i], b = x[i + rot / 2];
    x[i] = a * std::cos(angle) - b * std::sin(angle);
    x[i + rot / 2] = a * std::sin(angle) + b * std::cos(angle);
  }
}


}  // namespace lode::test
