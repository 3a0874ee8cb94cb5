// Four-lane float arithmetic for the k-quant searches (GCC/Clang vector extensions: one SSE2 or
// NEON register, the baseline of every 64-bit target we build for). The searches spend their
// time measuring "nearest code, error" over 16 or 32 values, and the compiler does not vectorize
// those loops on its own (the clamp before the float-to-int conversion defeats it).
#pragma once
#include <cstdint>
#include <cstring>

namespace lode::quant::lanes {

using Floats = float __attribute__((vector_size(16)));
using Ints = int32_t __attribute__((vector_size(16)));
constexpr int kWidth = 4;

inline Floats load(const float* p) {
  Floats v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline Floats splat(float f) { return Floats{} + f; }

inline Floats clamp(Floats v, float lo, float hi) {
  v = v < lo ? splat(lo) : v;
  return v > hi ? splat(hi) : v;
}

// Rounds values already clamped to [0, 2^23) to the nearest integer (ties up), as floats.
inline Floats round_non_negative(Floats v) {
  return __builtin_convertvector(__builtin_convertvector(v + 0.5f, Ints), Floats);
}

inline float sum(Floats v) {
  float total = 0;
  for (int i = 0; i < kWidth; ++i) total += v[i];
  return total;
}

}  // namespace lode::quant::lanes
