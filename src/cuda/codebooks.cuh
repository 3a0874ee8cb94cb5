// The lookup-table 4-bit formats' values in constant memory, made at compile time from core/quant's
// tables (iq4_table.h), so the values are written down once. Each kernel file that includes this
// holds its own copy (the kernels are not compiled as relocatable device code).
#pragma once
#include <array>
#include <cstdint>
#include <utility>

#include "core/quant/iq4_table.h"

namespace lode::cuda {

struct Codebook16 {
  int8_t values[16];
};

template <size_t... I>
constexpr Codebook16 codebook(const std::array<int8_t, 16>& values, std::index_sequence<I...>) {
  return {{values[I]...}};
}

static __constant__ Codebook16 kIq4Codebook = codebook(quant::kIq4Values, std::make_index_sequence<16>{});
static __constant__ Codebook16 kMxfp4Codebook = codebook(quant::kMxfp4Values, std::make_index_sequence<16>{});

}  // namespace lode::cuda
