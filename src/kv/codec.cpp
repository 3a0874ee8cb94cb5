#include "kv/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/fp16.h"
#include "core/quant/dequant.h"

namespace lode::kv {

namespace {

constexpr int64_t kQ4Values = 32, kQ4Bytes = 18;
constexpr float kLargestHalf = 65504.0f;

int64_t int8_codes_bytes(int64_t heads, int64_t head_dim) { return heads * head_dim; }

}  // namespace

void quantize_int8_group(const float* x, int8_t* codes, uint16_t* scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < kInt8GroupValues; ++i) amax = std::max(amax, std::fabs(x[i]));
  uint16_t bits = fp32_to_fp16(std::min(amax / 127.0f, kLargestHalf));
  const float stored = fp16_to_fp32(bits);
  if (stored == 0.0f || !std::isfinite(amax)) bits = 0;
  *scale = bits;
  for (int64_t i = 0; i < kInt8GroupValues; ++i) {
    const float q = bits ? std::nearbyint(x[i] / stored) : 0.0f;  // the default rounding: half to even
    codes[i] = std::isnan(q) ? 0 : int8_t(std::clamp(q, -127.0f, 127.0f));
  }
}

void hadamard(float* x, int64_t n) {
  for (int64_t span = 1; span < n; span <<= 1)
    for (int64_t start = 0; start < n; start += 2 * span)
      for (int64_t j = start; j < start + span; ++j) {
        const float a = x[j], b = x[j + span];
        x[j] = a + b;
        x[j + span] = a - b;
      }
  const float norm = 1.0f / std::sqrt(float(n));
  for (int64_t j = 0; j < n; ++j) x[j] *= norm;
}

void encode_row(Store store, const float* x, int64_t heads, int64_t head_dim, uint8_t* out) {
  const int64_t values = heads * head_dim;
  switch (store) {
    case Store::f32: std::memcpy(out, x, size_t(values) * sizeof(float)); return;
    case Store::f16: quant::quantize_row_f16(x, out, values); return;
    case Store::i8: {
      auto* codes = reinterpret_cast<int8_t*>(out);
      uint8_t* scales = out + int8_codes_bytes(heads, head_dim);
      for (int64_t g = 0; g < values / kInt8GroupValues; ++g) {
        uint16_t scale = 0;
        quantize_int8_group(x + g * kInt8GroupValues, codes + g * kInt8GroupValues, &scale);
        std::memcpy(scales + 2 * g, &scale, 2);
      }
      return;
    }
    case Store::q4r: {
      std::vector<float> rotated(static_cast<size_t>(head_dim));
      for (int64_t h = 0; h < heads; ++h) {
        std::copy(x + h * head_dim, x + (h + 1) * head_dim, rotated.begin());
        hadamard(rotated.data(), head_dim);
        quant::quantize_row_q4_0(rotated.data(), out + h * (head_dim / kQ4Values) * kQ4Bytes, head_dim);
      }
      return;
    }
    case Store::q4: quant::quantize_row_q4_0(x, out, heads * head_dim); return;
  }
}

void decode_head(Store store, const uint8_t* row, int64_t heads, int64_t head_dim, int64_t head, float* out) {
  switch (store) {
    case Store::f32: std::memcpy(out, row + head * head_dim * 4, size_t(head_dim) * sizeof(float)); return;
    case Store::f16: quant::dequantize_row_f16(row + head * head_dim * 2, out, head_dim); return;
    case Store::i8: {
      const auto* codes = reinterpret_cast<const int8_t*>(row) + head * head_dim;
      const uint8_t* scales = row + int8_codes_bytes(heads, head_dim) + head * (head_dim / kInt8GroupValues) * 2;
      for (int64_t g = 0; g < head_dim / kInt8GroupValues; ++g) {
        uint16_t bits;
        std::memcpy(&bits, scales + 2 * g, 2);
        const float scale = fp16_to_fp32(bits);
        for (int64_t i = 0; i < kInt8GroupValues; ++i)
          out[g * kInt8GroupValues + i] = float(codes[g * kInt8GroupValues + i]) * scale;
      }
      return;
    }
    case Store::q4r:
    case Store::q4:
      quant::dequantize_row_q4_0(row + head * (head_dim / kQ4Values) * kQ4Bytes, out, head_dim);
      return;
  }
}

void decode_row(Store store, const uint8_t* row, int64_t heads, int64_t head_dim, float* out) {
  for (int64_t h = 0; h < heads; ++h) decode_head(store, row, heads, head_dim, h, out + h * head_dim);
}

}  // namespace lode::kv
