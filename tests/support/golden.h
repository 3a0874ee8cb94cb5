// Golden vectors made by ggml itself (tools/oracle/gen_golden.c), one file per type:
// tests/data/golden/<ggml type name>.bin, all little-endian:
//   header: char magic[4] = "LGLD"; u32 version = 1; u32 ggml_type; u32 n_cases
//   case:   u32 kind; u32 n_values; char label[32] (NUL-padded)
//           f32 input[n_values]            -- kind 0 only: the floats ggml quantized
//           u8  bytes[row bytes of n_values] -- ggml's quantized bytes (kind 1: random valid blocks)
//           f32 dequantized[n_values]      -- ggml's to_float of those bytes
// kind 0 = ggml quantized `input` with its reference quantizer (for iq2_xxs, iq2_xs, iq1_s, which
// require an importance matrix, and iq1_m, which has no reference quantizer: ggml_quantize_chunk
// with an all-ones one); kind 1 = random block bytes (fp16 scales kept finite), exercising every code path.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lode::test {

struct GoldenCase {
  uint32_t kind = 0;
  std::string label;
  uint32_t n_values = 0;
  std::vector<float> input;       // empty for kind 1
  std::vector<uint8_t> bytes;
  std::vector<float> dequantized;
};

struct GoldenFile {
  uint32_t ggml_type = 0;
  std::vector<GoldenCase> cases;
};

// Reads tests/data/golden/<type_name>.bin; throws lode::Error on a missing or malformed file.
GoldenFile load_golden(const std::string& type_name);

}  // namespace lode::test
