// Lookup-table 4-bit formats: every 4-bit code indexes a 16-entry table of small integers that a
// block scale multiplies. IQ4_NL (32 values, fp16 scale) and IQ4_XS (256 values, fp16 scale times
// a 6-bit multiplier per 32) share ggml's non-linear table; MXFP4 (32 values) uses the FP4 E2M1
// values, doubled to integers, under a power-of-two E8M0 exponent.
// The quantizers are in iq4_quantize.cpp.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/dequant.h"
#include "core/quant/iq4_table.h"

namespace lode::quant {
namespace {

constexpr int kGroup = kIq4Group;

// E8M0 exponent e means 2^(e-127); ggml folds in the 1/2 that undoes the doubled table and builds
// the float 2^(e-128) from bits (subnormal for e < 2). e = 255 is not NaN here, just 2^127.
float e8m0_half_to_fp32(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23;
  return std::bit_cast<float>(bits);
}

// One group of 32: low nibbles first, then high nibbles, each value table[code] * scale (a single
// float multiply, as ggml does).
void dequantize_group(const uint8_t* qs, const std::array<int8_t, 16>& table, float scale, float* dst) {
  for (int j = 0; j < kGroup / 2; ++j) {
    dst[j] = scale * float(table[qs[j] & 0xf]);
    dst[j + kGroup / 2] = scale * float(table[qs[j] >> 4]);
  }
}

int iq4_xs_multiplier(const BlockIQ4_XS& b, int ib) {
  const int low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
  const int high = (b.scales_h >> (2 * ib)) & 3;
  return (low | high << 4) - 32;
}

}  // namespace

void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ4_NL*>(src);
  for (int64_t i = 0; i < n / QK4_NL; ++i)
    dequantize_group(blocks[i].qs, kIq4Values, fp16_to_fp32(blocks[i].d), dst + i * QK4_NL);
}

void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ4_XS*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(blocks[i].d);
    for (int ib = 0; ib < QK_K / kGroup; ++ib) {
      // ggml rounds d * multiplier to float first, then multiplies by the table value.
      const float scale = d * float(iq4_xs_multiplier(blocks[i], ib));
      dequantize_group(blocks[i].qs + ib * kGroup / 2, kIq4Values, scale, dst + i * QK_K + ib * kGroup);
    }
  }
}

void dequantize_row_mxfp4(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockMXFP4*>(src);
  for (int64_t i = 0; i < n / QK_MXFP4; ++i)
    dequantize_group(blocks[i].qs, kMxfp4Values, e8m0_half_to_fp32(blocks[i].e), dst + i * QK_MXFP4);
}

}  // namespace lode::quant
