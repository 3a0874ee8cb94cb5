// Elementwise and per-vector float32 operations of the qwen35moe forward pass. Each works on one
// vector at a time, so its result never depends on how many tokens are processed together.
#pragma once
#include <cstdint>

namespace lode::cpu {

float sigmoid(float x);
float silu(float x);
float softplus(float x);

// out = x * rsqrt(mean(x^2) + eps) * w (w used as stored: GGUF norms already carry the +1).
// `out` may alias `x`.
void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps);
// x = x * rsqrt(sum(x^2) + eps), in place.
void l2_norm(float* x, int64_t n, float eps);
// In-place softmax of x[0, n).
void softmax(float* x, int64_t n);

// NeoX-style rotary embedding on the first n_rot dims of one head vector x[0, head_dim): pairs
// (i, i + n_rot/2) for i < n_rot/2 are rotated by pos * theta^(-2i/n_rot); dims >= n_rot stay.
void rope_neox(float* x, int64_t n_rot, int64_t pos, double theta);

}  // namespace lode::cpu
