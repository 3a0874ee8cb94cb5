// The IQ4 non-linear table shared by the IQ4_NL / IQ4_XS dequantizers (iq4.cpp) and quantizers
// (iq4_quantize.cpp). Code c of a byte's low nibble is value j of its 32-value group, the high
// nibble is value j + 16.
#pragma once
#include <array>
#include <cstdint>

namespace lode::quant {

constexpr std::array<int8_t, 16> kIq4Values = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};
constexpr int kIq4Group = 32;  // values per IQ4_NL / MXFP4 block and per IQ4_XS sub-block

}  // namespace lode::quant
