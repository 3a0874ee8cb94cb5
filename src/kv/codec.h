// Reference quantizers and dequantizers of the K/V stores (kv/format.h), byte for byte as
// ../shared/spec/kv-formats.md lays them out. The CPU engine stores its cache with these, and the
// GPU's writes must reproduce them bit for bit.
//
// A row is one side (K or V) of one position: `heads` vectors of head_dim values.
//   f32  the floats, heads in order
//   f16  IEEE halves, heads in order
//   i8   all heads*head_dim codes (int8) first, then one fp16 scale per group of 64 values, in
//        value order: codes stay 16-byte aligned for wide loads
//   q4r  per head, head_dim/32 ggml q4_0 blocks (fp16 d, 16 bytes of nibbles) of H·x, the head's
//        vector rotated by the orthonormal Walsh-Hadamard transform H
//   q4   the same blocks of x itself (the debug format q4-unrotated)
#pragma once
#include <cstdint>

#include "kv/format.h"

namespace lode::kv {

constexpr int64_t kInt8GroupValues = 64;

// The int8 group rule: scale = fp16(amax / 127), codes = clamp(round_half_even(x / scale), ±127)
// against the stored scale. A group whose scale is 0 in fp16 (all zero, or too small for fp16)
// stores scale 0 and codes 0; a scale beyond fp16's range is held at its largest finite value
// (65504) so that nothing decodes to infinity or NaN.
void quantize_int8_group(const float* x, int8_t* codes, uint16_t* scale);

// x <- H·x in place for n a power of two: the butterflies of the fast Walsh-Hadamard transform in
// stages of span 1, 2, 4, ... (a + b, a - b), then a scale of 1/sqrt(n). H is its own inverse.
void hadamard(float* x, int64_t n);

inline bool is_rotated(Store store) { return store == Store::q4r; }

// Encodes one row (heads * head_dim values) into row_bytes(store, heads, head_dim) bytes.
void encode_row(Store store, const float* x, int64_t heads, int64_t head_dim, uint8_t* out);
// Decodes head `head` of an encoded row into head_dim floats: what the store holds, so for q4r
// the rotated vector H·x (attention rotates the query and its output instead of every key and value).
void decode_head(Store store, const uint8_t* row, int64_t heads, int64_t head_dim, int64_t head, float* out);
// Every head of a row, in order.
void decode_row(Store store, const uint8_t* row, int64_t heads, int64_t head_dim, float* out);

}  // namespace lode::kv
