#include "cpu/ops.h"

#include <cmath>

#include "cpu/matmul.h"

namespace lode::cpu {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

float silu(float x) { return x * sigmoid(x); }

// log(1 + e^x) without overflow for large x (torch's softplus switches to x above 20).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps) {
  const float mean_square = dot(x, x, n) / float(n);
  const float scale = 1.0f / std::sqrt(mean_square + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

void l2_norm(float* x, int64_t n, float eps) {
  const float scale = 1.0f / std::sqrt(dot(x, x, n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

void softmax(float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = std::max(max, x[i]);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

void rope_neox(float* x, int64_t n_rot, int64_t pos, double theta) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    // transformers computes inv_freq and the angle in float32; so do we.
    const float inv_freq = float(1.0 / std::pow(theta, double(2 * i) / double(n_rot)));
    const float angle = float(pos) * inv_freq;
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

}  // namespace lode::cpu
