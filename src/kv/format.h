// The K/V cache formats of ../shared/spec/kv-formats.md, shared by every engine: which store each
// side (K, V) uses, the bytes one position takes, the --kv names, and which head sizes a format
// can hold. The stores' byte layouts and their reference quantizers are in kv/codec.h.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lode::kv {

// How one side (K or V) of a cache row is stored.
enum class Store {
  f32,  // float32
  f16,  // IEEE half
  i8,   // int8 codes, one fp16 scale per 64 values (the int8 group rule)
  q4r,  // ggml q4_0 blocks (32 values) of the Hadamard-rotated head vector
  q4,   // ggml q4_0 blocks of the head vector as it is (only for showing what the rotation buys)
};

// q4_unrotated ("q4-unrotated") is q4 without the rotation: a debug format, accepted by name but
// left out of all_formats() and the --kv help, to measure what the rotation buys.
enum class Format { f32, f16, k8v8, k8v32, k32v8, q4, k8v4, q4_unrotated };

struct Layout {
  Store k, v;
};

Layout layout(Format format);
// The --kv name: fp32, fp16, int8, k8v32, k32v8, q4, k8v4 (k8v8 is int8's other name), q4-unrotated.
const char* to_string(Format format);
const std::vector<Format>& all_formats();  // the formats for use: all but q4_unrotated
// Fails (lode::Error) on an unknown name, listing the valid ones.
Format parse_format(std::string_view name);
// The format a command runs with: its --kv when given, else the environment's LODE_KV when set,
// else fp16. `env` is the value of LODE_KV (null when unset).
Format choose_format(std::string_view flag, const char* env);

// Bytes of one side of one position: heads vectors of head_dim values in `store`.
int64_t row_bytes(Store store, int64_t heads, int64_t head_dim);
// Bytes of one cell: one position of one attention layer, K and V.
int64_t cell_bytes(Format format, int64_t heads, int64_t head_dim);

// One line for logs: "fp16, 2048 bytes per cell x 10 attention layers: 160.0 MiB for 8192 positions".
std::string describe(Format format, int64_t attention_layers, int64_t heads, int64_t head_dim, int64_t positions);

// Why `format` cannot hold heads of head_dim values (int8 groups need a multiple of 64; q4 blocks
// a multiple of 32 and the rotation a power of two), with the formats that can; empty when it can.
std::string unsupported_reason(Format format, int64_t head_dim);
// The MTP block's K/V format (its drafter's cache, on either engine): int8 (k8v8, a quarter of
// fp32's bytes), or `fallback` (the sequence's) where int8 cannot hold heads of head_dim.
Format mtp_format(int64_t head_dim, Format fallback);
// Fails with unsupported_reason when there is one.
void check_head_dim(Format format, int64_t head_dim);

}  // namespace lode::kv
