// Dequantizers of the grid i-quants, bit-exact with ggml's to_float.
//
// All of them share one idea: a 256-value super-block has one fp16 scale d; each group of 8 values
// is an index into a fixed codebook of magnitude patterns (iq_grids.h) plus 8 sign bits (stored
// directly, or as a 7-bit index whose 8th bit is the even-parity bit, ksigns_iq2xs), and each
// 16- or 32-value sub-block has a small integer scale that multiplies d.
//
// Exactness: the float operations are ggml's, in ggml's order: the sub-block scale is formed first,
// then value = (scale * magnitude) * (+1 or -1). Applying the sign by that multiplication, as ggml
// does, keeps its zeros signed alike (a negative value of a zero scale is -0.0). IQ1_S/IQ1_M
// instead compute scale * (grid value + delta), delta = +-1/8.
#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/dequant.h"
#include "core/quant/iq_grids.h"

namespace lode::quant {
namespace {

constexpr float kIq1Delta = 0.125f;

uint32_t load_u32_le(const uint8_t* bytes) {
  return uint32_t(bytes[0]) | uint32_t(bytes[1]) << 8 | uint32_t(bytes[2]) << 16 | uint32_t(bytes[3]) << 24;
}

uint16_t load_u16_le(const uint8_t* bytes) { return uint16_t(bytes[0] | bytes[1] << 8); }

// Writes 8 values: magnitude j is byte j of `magnitudes`, negated where bit j of `negative` is set.
void put_signed_8(float scale, uint64_t magnitudes, uint8_t negative, float* out) {
  for (int j = 0; j < 8; ++j) {
    const float magnitude = float(uint8_t(magnitudes >> (8 * j)));
    out[j] = scale * magnitude * ((negative >> j) & 1 ? -1.0f : 1.0f);
  }
}

// The IQ3 grids hold 4 values per entry; a group of 8 is two entries side by side.
uint64_t two_iq3_entries(const uint32_t* grid, int first, int second) {
  return uint64_t(grid[first]) | uint64_t(grid[second]) << 32;
}

// The IQ2 scales: a 4-bit s means (s + 1/2) / 4 times d.
float iq2_scale(float d, int s) { return d * (0.5f + float(s)) * 0.25f; }

// Writes 8 values of IQ1_S/IQ1_M: scale * (g + delta), g in {-1, 0, 1}.
void put_iq1_8(float scale, uint64_t entry, float delta, float* out) {
  for (int j = 0; j < 8; ++j) out[j] = scale * (float(int8_t(uint8_t(entry >> (8 * j)))) + delta);
}

// IQ1_M has no fp16 field: the super-block scale's 16 bits are the top nibbles of the four
// little-endian uint16 words of scales[] (word 0 gives the lowest nibble).
float iq1_m_super_scale(const uint16_t words[4]) {
  const uint16_t bits = uint16_t((words[0] >> 12) | (words[1] >> 12) << 4 | (words[2] >> 12) << 8 |
                                 (words[3] >> 12) << 12);
  return fp16_to_fp32(bits);
}

}  // namespace

// IQ2_XXS: per 32 values, 8 bytes = two little-endian words. Word 0: 4 grid indices (one byte
// each, 8 values per index). Word 1: four 7-bit sign indices, then a 4-bit scale in bits 28..31.
void dequantize_row_iq2_xxs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_XXS*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float d = fp16_to_fp32(blocks[b].d);
    const auto* groups = reinterpret_cast<const uint8_t*>(blocks[b].qs);
    for (int sub = 0; sub < QK_K / 32; ++sub, dst += 32) {
      const uint8_t* group = groups + 8 * sub;
      const uint32_t signs_and_scale = load_u32_le(group + 4);
      const float scale = iq2_scale(d, int(signs_and_scale >> 28));
      for (int k = 0; k < 4; ++k) {
        const uint8_t negative = ksigns_iq2xs[(signs_and_scale >> (7 * k)) & 127];
        put_signed_8(scale, iq2xxs_grid[group[k]], negative, dst + 8 * k);
      }
    }
  }
}

// IQ2_XS: per 8 values, one uint16: 9-bit grid index, then a 7-bit sign index. Per 32 values,
// one scale byte: low nibble for the first 16 values, high nibble for the next 16.
void dequantize_row_iq2_xs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_XS*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockIQ2_XS& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    for (int sub = 0; sub < QK_K / 32; ++sub, dst += 32) {
      const float scales[2] = {iq2_scale(d, block.scales[sub] & 15), iq2_scale(d, block.scales[sub] >> 4)};
      for (int k = 0; k < 4; ++k) {
        const uint16_t code = block.qs[4 * sub + k];
        put_signed_8(scales[k / 2], iq2xs_grid[code & 511], ksigns_iq2xs[code >> 9], dst + 8 * k);
      }
    }
  }
}

// IQ2_S: qs holds 32 low index bytes, then 32 plain sign bytes (one per 8 values). qh adds two
// high index bits per 8 values (bits 2k, 2k+1 of qh[sub] for group k). Scales as IQ2_XS.
void dequantize_row_iq2_s(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ2_S*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockIQ2_S& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    const uint8_t* low_index = block.qs;
    const uint8_t* negative = block.qs + QK_K / 8;
    for (int sub = 0; sub < QK_K / 32; ++sub, dst += 32) {
      const float scales[2] = {iq2_scale(d, block.scales[sub] & 15), iq2_scale(d, block.scales[sub] >> 4)};
      for (int k = 0; k < 4; ++k) {
        const int g = 4 * sub + k;
        const int index = low_index[g] | ((block.qh[sub] >> (2 * k)) & 3) << 8;
        put_signed_8(scales[k / 2], iq2s_grid[index], negative[g], dst + 8 * k);
      }
    }
  }
}

// IQ3_XXS: qs holds 64 grid indices (4 values each), then per 32 values one little-endian word:
// four 7-bit sign indices and a 4-bit scale in bits 28..31, meaning (s + 1/2) / 2 times d.
void dequantize_row_iq3_xxs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ3_XXS*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockIQ3_XXS& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    const uint8_t* indices = block.qs;
    const uint8_t* words = block.qs + QK_K / 4;
    for (int sub = 0; sub < QK_K / 32; ++sub, dst += 32) {
      const uint32_t signs_and_scale = load_u32_le(words + 4 * sub);
      const float scale = d * (0.5f + float(signs_and_scale >> 28)) * 0.5f;
      for (int k = 0; k < 4; ++k) {
        const uint8_t* pair = indices + 8 * sub + 2 * k;
        const uint8_t negative = ksigns_iq2xs[(signs_and_scale >> (7 * k)) & 127];
        put_signed_8(scale, two_iq3_entries(iq3xxs_grid, pair[0], pair[1]), negative, dst + 8 * k);
      }
    }
  }
}

// IQ3_S: per 32 values, 8 low index bytes (4 values each), one qh byte whose bit i is bit 8 of
// index i, 4 plain sign bytes, and a 4-bit scale s (nibbles of scales[]) meaning (2s + 1) times d.
void dequantize_row_iq3_s(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ3_S*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockIQ3_S& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    for (int sub = 0; sub < QK_K / 32; ++sub, dst += 32) {
      const int s = (block.scales[sub / 2] >> (4 * (sub % 2))) & 15;
      const float scale = d * float(1 + 2 * s);
      const uint8_t* low_index = block.qs + 8 * sub;
      const int high_bits = block.qh[sub];
      for (int k = 0; k < 4; ++k) {
        const int first = low_index[2 * k] | ((high_bits >> (2 * k)) & 1) << 8;
        const int second = low_index[2 * k + 1] | ((high_bits >> (2 * k + 1)) & 1) << 8;
        put_signed_8(scale, two_iq3_entries(iq3s_grid, first, second), block.signs[4 * sub + k], dst + 8 * k);
      }
    }
  }
}

// IQ1_S: per 8 values, a low index byte in qs. Per 32 values, one uint16 qh: bits 3k..3k+2 are
// the high index bits of group k, bits 12..14 a 3-bit scale s meaning (2s + 1) times d, bit 15
// the sign of the delta shared by the 32 values.
void dequantize_row_iq1_s(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ1_S*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockIQ1_S& block = blocks[b];
    const float d = fp16_to_fp32(block.d);
    for (int sub = 0; sub < QK_K / 32; ++sub, dst += 32) {
      const int high = block.qh[sub];
      const float scale = d * float(2 * ((high >> 12) & 7) + 1);
      const float delta = (high & 0x8000) ? -kIq1Delta : kIq1Delta;
      for (int k = 0; k < 4; ++k) {
        const int index = block.qs[4 * sub + k] | ((high >> (3 * k)) & 7) << 8;
        put_iq1_8(scale, iq1s_grid[index], delta, dst + 8 * k);
      }
    }
  }
}

// IQ1_M: per 8 values, a low index byte in qs and a nibble of qh (low nibble for the even group):
// 3 high index bits and the delta's sign in bit 3. Each 16 values has a 3-bit scale s, (2s + 1)
// times d; the 32-value sub-block `sub` reads its two from bits 6*(sub%2) of word sub/2.
void dequantize_row_iq1_m(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ1_M*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const BlockIQ1_M& block = blocks[b];
    uint16_t words[4];
    for (int w = 0; w < 4; ++w) words[w] = load_u16_le(block.scales + 2 * w);
    const float d = iq1_m_super_scale(words);
    for (int sub = 0; sub < QK_K / 32; ++sub, dst += 32) {
      const int scale_bits = words[sub / 2] >> (6 * (sub % 2));
      const float scales[2] = {d * float(2 * (scale_bits & 7) + 1), d * float(2 * ((scale_bits >> 3) & 7) + 1)};
      for (int k = 0; k < 4; ++k) {
        const int nibble = (block.qh[2 * sub + k / 2] >> (4 * (k % 2))) & 15;
        const int index = block.qs[4 * sub + k] | (nibble & 7) << 8;
        const float delta = (nibble & 8) ? -kIq1Delta : kIq1Delta;
        put_iq1_8(scales[k / 2], iq1s_grid[index], delta, dst + 8 * k);
      }
    }
  }
}

}  // namespace lode::quant
