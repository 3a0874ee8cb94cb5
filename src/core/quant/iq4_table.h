// The lookup-table 4-bit formats' value tables, the one copy lode has: the IQ4 non-linear table of
// IQ4_NL / IQ4_XS and MXFP4's, read by the dequantizers (iq4.cpp), the quantizers (iq4_quantize.cpp)
// and the CUDA kernels (cuda/codebooks.cuh). The code in a byte's low nibble is value j of its
// 32-value group, the high nibble value j + 16.
#pragma once
#include <array>
#include <cstdint>

namespace lode::quant {

constexpr std::array<int8_t, 16> kIq4Values = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};
// MXFP4's FP4 E2M1 values, doubled to integers (its E8M0 scale carries the half back).
constexpr std::array<int8_t, 16> kMxfp4Values = {0, 1,  2,  3,  4,  6,  8,  12,
                                                 0, -1, -2, -3, -4, -6, -8, -12};
constexpr int kIq4Group = 32;  // values per IQ4_NL / MXFP4 block and per IQ4_XS sub-block

}  // namespace lode::quant
