#include "cpu/fast_rows.h"

#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/kquants_scales.h"

namespace lode::cpu {
namespace {

using namespace lode::quant;

#define LODE_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))

LODE_VECTOR_CLONES
void q8_0_row(const void* src, float* __restrict dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / QK8_0; ++b, dst += QK8_0) {
    const float d = fp16_to_fp32(blocks[b].d);
    const int8_t* __restrict q = blocks[b].qs;
    for (int i = 0; i < QK8_0; ++i) dst[i] = float(q[i]) * d;
  }
}

LODE_VECTOR_CLONES
void q4_K_row(const void* src, float* __restrict dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockQ4_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d), dmin = fp16_to_fp32(block.dmin);
    for (int sub = 0; sub < 8; ++sub, dst += 32) {
      const ScaleMin sm = unpack_scale_min_k4(block.scales, sub);
      const float dl = d * float(sm.scale), ml = dmin * float(sm.min);
      const uint8_t* __restrict qs = block.qs + 32 * (sub / 2);
      const int shift = 4 * (sub % 2);
      for (int l = 0; l < 32; ++l) dst[l] = dl * float((qs[l] >> shift) & 0x0f) - ml;
    }
  }
}

LODE_VECTOR_CLONES
void q5_K_row(const void* src, float* __restrict dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockQ5_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d), dmin = fp16_to_fp32(block.dmin);
    for (int sub = 0; sub < 8; ++sub, dst += 32) {
      const ScaleMin sm = unpack_scale_min_k4(block.scales, sub);
      const float dl = d * float(sm.scale), ml = dmin * float(sm.min);
      const uint8_t* __restrict qs = block.qs + 32 * (sub / 2);
      const uint8_t* __restrict qh = block.qh;
      const int shift = 4 * (sub % 2);
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[l] >> shift) & 0x0f) | (((qh[l] >> sub) & 1) << 4);
        dst[l] = dl * float(q) - ml;
      }
    }
  }
}

// q6_K: per 16 values one scale; value = (d * scale) * q, as the reference computes it.
LODE_VECTOR_CLONES
void q6_K_row(const void* src, float* __restrict dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockQ6_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = block.ql + 64 * half;
      const uint8_t* qh = block.qh + 32 * half;
      for (int quarter = 0; quarter < 4; ++quarter) {
        const uint8_t* __restrict low = ql + 32 * (quarter % 2);
        const int low_shift = 4 * (quarter / 2), high_shift = 2 * quarter;
        for (int part = 0; part < 2; ++part, dst += 16) {
          const float ds = d * float(block.scales[8 * half + 2 * quarter + part]);
          const uint8_t* __restrict lo = low + 16 * part;
          const uint8_t* __restrict hi = qh + 16 * part;
          for (int l = 0; l < 16; ++l) {
            const int q = (((lo[l] >> low_shift) & 0x0f) | (((hi[l] >> high_shift) & 3) << 4)) - 32;
            dst[l] = ds * float(q);
          }
        }
      }
    }
  }
}

}  // namespace

DequantizeRow row_decoder(GgmlType type) {
  switch (type) {
    case GgmlType::Q8_0: return q8_0_row;
    case GgmlType::Q4_K: return q4_K_row;
    case GgmlType::Q5_K: return q5_K_row;
    case GgmlType::Q6_K: return q6_K_row;
    default: return traits(type).dequantize;
  }
}

}  // namespace lode::cpu
