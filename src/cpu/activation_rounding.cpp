#include "cpu/activation_rounding.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/fp16.h"

namespace lode::cpu {

namespace {

constexpr int64_t kQ8_0Block = 32;
constexpr int64_t kQ8_KBlock = 256;

// Round half to even, as the SIMD rounding ggml's quantizers use.
float round_even(float v) { return std::nearbyint(v); }

void round_q8_0(const float* x, float* out, int64_t n) {
  for (int64_t b = 0; b < n; b += kQ8_0Block) {
    float amax = 0.0f;
    for (int64_t j = 0; j < kQ8_0Block; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = fp16_to_fp32(fp32_to_fp16(amax / 127.0f));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t j = 0; j < kQ8_0Block; ++j) out[b + j] = d * round_even(x[b + j] * id);
  }
}

void round_q8_k(const float* x, float* out, int64_t n) {
  for (int64_t b = 0; b < n; b += kQ8_KBlock) {
    float amax = 0.0f, max = 0.0f;  // max: the signed value of largest magnitude (first one)
    for (int64_t j = 0; j < kQ8_KBlock; ++j) {
      if (std::fabs(x[b + j]) > amax) {
        amax = std::fabs(x[b + j]);
        max = x[b + j];
      }
    }
    if (amax == 0.0f) {
      std::fill_n(out + b, kQ8_KBlock, 0.0f);
      continue;
    }
    const float iscale = -127.0f / max;
    const float d = 1.0f / iscale;
    for (int64_t j = 0; j < kQ8_KBlock; ++j) {
      out[b + j] = d * std::min(127.0f, round_even(iscale * x[b + j]));
    }
  }
}

}  // namespace

GgmlType activation_type_for(GgmlType weight) {
  switch (weight) {
    case GgmlType::F32: return GgmlType::F32;
    case GgmlType::F16: return GgmlType::F16;
    case GgmlType::BF16: return GgmlType::BF16;
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q8_0: case GgmlType::Q8_1: case GgmlType::IQ4_NL: case GgmlType::MXFP4:
      return GgmlType::Q8_0;  // Q8_1 for the _1 types: the same values plus a block sum
    default:
      return GgmlType::Q8_K;  // K-quants, I-quants, ternary types
  }
}

void round_activations(GgmlType weight, const float* x, float* out, int64_t n) {
  const GgmlType to = activation_type_for(weight);
  const int64_t block = to == GgmlType::Q8_0 ? kQ8_0Block : to == GgmlType::Q8_K ? kQ8_KBlock : 1;
  if (n % block != 0) fail("cpu: {} activations of length {} are not whole blocks of {}", traits(to).name, n, block);
  switch (to) {
    case GgmlType::Q8_0: round_q8_0(x, out, n); return;
    case GgmlType::Q8_K: round_q8_k(x, out, n); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
      return;
    default:
      if (out != x) std::copy_n(x, n, out);
  }
}

}  // namespace lode::cpu
