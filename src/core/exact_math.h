// Float arithmetic that the GPU and the host compute bit for bit alike: each operation rounded on
// its own (no fused multiply-add), so the CPU miss path (cpu/q8_products.h) reproduces the CUDA
// decode kernels' expert products exactly. On the device the intrinsics forbid contraction; host
// code that includes this is compiled with -ffp-contract=off (CMakeLists.txt), so the plain
// operators round each step too.
#pragma once
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define LODE_EXACT __host__ __device__ __forceinline__
#else
#include <cmath>
#define LODE_EXACT inline
#endif

namespace lode::exact {

LODE_EXACT float mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

LODE_EXACT float add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

LODE_EXACT float sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

LODE_EXACT float div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// Round to the nearest integer, ties to even (the default rounding mode on both sides).
LODE_EXACT float round_even(float x) {
#ifdef __CUDA_ARCH__
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

LODE_EXACT float from_bits(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// e^x for the sigmoid in a SwiGLU: Cody-Waite reduction by ln 2 and a degree-6 polynomial (about
// one ulp), with every step rounded on its own. Below -80 it returns 0 (1 + e^x is 1 there
// anyway), above 88 infinity.
LODE_EXACT float exp_for_sigmoid(float x) {
  if (x > 88.0f) return INFINITY;
  if (x < -80.0f) return 0.0f;
  if (!(x == x)) return x;  // NaN
  const float n = round_even(mul(x, 1.44269504088896341f));
  // ln 2 in two parts; n * 0.693359375 is exact (9 significant bits times |n| <= 127).
  float r = sub(x, mul(n, 0.693359375f));
  r = sub(r, mul(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = add(mul(p, r), 1.3981999507e-3f);
  p = add(mul(p, r), 8.3334519073e-3f);
  p = add(mul(p, r), 4.1665795894e-2f);
  p = add(mul(p, r), 1.6666665459e-1f);
  p = add(mul(p, r), 5.0000001201e-1f);
  p = add(add(mul(p, mul(r, r)), r), 1.0f);
  return mul(p, from_bits(uint32_t(int32_t(n) + 127) << 23));  // times 2^n, n in [-116, 127]
}

// silu(g) * u, a SwiGLU's value, as the decode kernels and the CPU miss path compute it.
LODE_EXACT float swiglu(float g, float u) {
  const float silu = div(g, add(1.0f, exp_for_sigmoid(-g)));
  return mul(silu, u);
}

}  // namespace lode::exact
