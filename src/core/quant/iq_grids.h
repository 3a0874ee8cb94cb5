// Lookup tables of ggml's grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M).
// These formats store, per group of 8 (or 4) weights, an index into a fixed codebook ("grid") of
// magnitude patterns plus separate signs. The codebooks are data taken verbatim from ggml's oracle
// build by tools/oracle/extract_grids.py (see iq_grids.cpp, which is generated). Names follow the
// ggml symbols they were read from. Entry e holds value j in byte j: (e >> 8*j) & 0xff.
#pragma once
#include <cstdint>

namespace lode::quant {

// 8 unsigned magnitudes per entry, each one of 8, 25, 43 (scaled down by 1/8 at dequantization).
extern const uint64_t iq2xxs_grid[256];  // IQ2_XXS: 8-bit index
extern const uint64_t iq2xs_grid[512];   // IQ2_XS: 9-bit index
extern const uint64_t iq2s_grid[1024];   // IQ2_S: 10-bit index
// 4 unsigned magnitudes per entry.
extern const uint32_t iq3xxs_grid[256];  // IQ3_XXS: each one of 4, 12, 20, 28, 36, 44, 52, 62
extern const uint32_t iq3s_grid[512];    // IQ3_S: each one of 1, 3, 5, ..., 15
// 8 signed values per entry, each byte an int8 of -1, 0 or 1 (IQ1_S and IQ1_M share it).
extern const uint64_t iq1s_grid[2048];
// Sign patterns of 8 values from a 7-bit index: bit j set = value j is negative. Bit 7 is
// implied, chosen so the count of negatives is even (the quantizer flips the cheapest one).
extern const uint8_t ksigns_iq2xs[128];

}  // namespace lode::quant
