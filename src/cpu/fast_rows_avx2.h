// The AVX2 row decoders behind cpu/fast_rows.h, for the types they cover. Internal to it; the host
// must have AVX2 and F16C (core/host_isa.h).
#pragma once
#include "core/quant/types.h"

namespace lode::cpu::avx2 {

// The AVX2 decoder of `type`, or null where there is none.
DequantizeRow row_decoder(GgmlType type);

}  // namespace lode::cpu::avx2
