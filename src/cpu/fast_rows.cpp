#include "cpu/fast_rows.h"

#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/kquants_scales.h"
#include "cpu/fast_rows_avx2.h"
#include "core/host_isa.h"

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

// 16 q6_K values: the low nibbles of `lo` shifted down by kLowShift with bits kHighShift,
// kHighShift + 1 of `hi` on top, less 32, times ds. Shifts fixed at compile time vectorize (2x
// faster than shifts chosen in the loop).
template <int kLowShift, int kHighShift>
__attribute__((always_inline)) inline void q6_K_sixteen(const uint8_t* __restrict lo, const uint8_t* __restrict hi,
                                                        float ds, float* __restrict dst) {
  for (int l = 0; l < 16; ++l) {
    const int q = (((lo[l] >> kLowShift) & 0x0f) | (((hi[l] >> kHighShift) & 3) << 4)) - 32;
    dst[l] = ds * float(q);
  }
}

// q6_K: per 16 values one scale; value = (d * scale) * q, as the reference computes it. A half of a
// block is four quarters of 32 values: quarter q takes the low nibbles of ql bytes 32 * (q % 2)..
// (shifted by 4 for q >= 2) and bits 2q, 2q + 1 of qh.
LODE_VECTOR_CLONES
void q6_K_row(const void* src, float* __restrict dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockQ6_K& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    for (int half = 0; half < 2; ++half, dst += 128) {
      const uint8_t* ql = block.ql + 64 * half;
      const uint8_t* qh = block.qh + 32 * half;
      const int8_t* sc = block.scales + 8 * half;
      for (int part = 0; part < 2; ++part) {
        const uint8_t* lo = ql + 16 * part;
        const uint8_t* hi = qh + 16 * part;
        q6_K_sixteen<0, 0>(lo, hi, d * float(sc[0 + part]), dst + 0 + 16 * part);
        q6_K_sixteen<0, 2>(lo + 32, hi, d * float(sc[2 + part]), dst + 32 + 16 * part);
        q6_K_sixteen<4, 4>(lo, hi, d * float(sc[4 + part]), dst + 64 + 16 * part);
        q6_K_sixteen<4, 6>(lo + 32, hi, d * float(sc[6 + part]), dst + 96 + 16 * part);
      }
    }
  }
}

}  // namespace

DequantizeRow row_decoder(GgmlType type, Decoders decoders) {
  if (decoders == Decoders::host && host_has_avx2())
    if (const DequantizeRow avx2 = avx2::row_decoder(type)) return avx2;
  switch (type) {
    case GgmlType::Q8_0: return q8_0_row;
    case GgmlType::Q4_K: return q4_K_row;
    case GgmlType::Q5_K: return q5_K_row;
    case GgmlType::Q6_K: return q6_K_row;
    default: return traits(type).dequantize;
  }
}

}  // namespace lode::cpu
