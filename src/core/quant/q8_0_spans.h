// Where the 8-bit-activation products of Q8_0 rows (cuda/matvec_q8_kernels.cu, and its host twin
// cpu/q8_twin.h, which must sum in the same order) cut a row into spans of 8 blocks rather than
// slices of 8 values: a span is 272 bytes, 17 16-byte words from a row's start when the row holds a
// multiple of 256 values, so a lane reads it in whole words and knows at compile time which block
// each 4-byte part belongs to. Rows of more than 64 spans would not fit the kernel's shared memory.
#pragma once
#include <cstdint>

namespace lode::quant {

constexpr int kQ8_0SpanBlocks = 8, kQ8_0SpanValues = 256, kQ8_0MaxSpans = 64;

constexpr bool q8_0_in_spans(int64_t cols) {
  return cols > 0 && cols % kQ8_0SpanValues == 0 && cols / kQ8_0SpanValues <= kQ8_0MaxSpans;
}

}  // namespace lode::quant
