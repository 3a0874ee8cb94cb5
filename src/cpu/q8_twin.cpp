#include "cpu/q8_twin.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/exact_math.h"
#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/q8_0_spans.h"
#include "cpu/q8_twin_fast.h"

namespace lode::cpu::q8twin {

using namespace lode::quant;

bool has_twin(GgmlType type) {
  return type == GgmlType::Q8_0 || type == GgmlType::Q5_0 || type == GgmlType::Q4_K || type == GgmlType::Q5_K ||
         type == GgmlType::Q6_K;
}

namespace {

size_t aligned64(size_t n) { return (n + 63) / 64 * 64; }

float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return fp16_to_fp32(bits);
}

bool q8_0_blocks(GgmlType type) { return type == GgmlType::Q8_0 || type == GgmlType::Q5_0; }

int slice_values(GgmlType type) { return q8_0_blocks(type) ? 8 : 32; }

// The GPU's lanes per row: the largest power of two <= min(32, slices).
int lanes_for(int64_t slices) {
  int lanes = 32;
  while (lanes > 1 && lanes > slices) lanes /= 2;
  return lanes;
}

// Lane 0's result of the GPU's butterfly over v[0, lanes).
float butterfly(float* v, int lanes) {
  for (int o = lanes / 2; o > 0; o /= 2)
    for (int i = 0; i < o; ++i) v[i] = exact::add(v[i], v[i + o]);
  return v[0];
}

// Q4_K / Q5_K sub-block j's 6-bit scale and min (the GPU's scale_min_k4).
void scale_min_k4(const uint8_t* packed, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4);
    *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// Slice s of each type, as the GPU's Slice<T>::dot.
float slice_q8_0(const uint8_t* row, int s, const RoundedX& x) {
  const int b = s / 4, part = s % 4;
  const uint8_t* block = row + b * sizeof(BlockQ8_0);
  const int8_t* q = reinterpret_cast<const int8_t*>(block + 2 + 8 * part);
  const int8_t* xq = x.q + 32 * b + 8 * part;
  int sum = 0;
  for (int i = 0; i < 8; ++i) sum += int(q[i]) * int(xq[i]);
  return exact::mul(exact::mul(half_at(block), x.d[b]), float(sum));
}

float slice_q5_0(const uint8_t* row, int s, const RoundedX& x) {
  const int b = s / 4, part = s % 4;
  const uint8_t* block = row + b * sizeof(BlockQ5_0);
  uint32_t qh;
  std::memcpy(&qh, block + 2, 4);
  const uint8_t* qs = block + 6 + 8 * (part % 2);
  const int8_t* xq = x.q + 32 * b + 8 * part;
  int dot = 0, sum = 0;
  for (int j = 0; j < 8; ++j) {
    const int nibble = part < 2 ? qs[j] & 15 : qs[j] >> 4;
    const int u = nibble | int((qh >> (8 * part + j)) & 1) << 4;
    dot += u * int(xq[j]);
    sum += int(xq[j]);
  }
  return exact::mul(exact::mul(half_at(block), x.d[b]), float(dot - 16 * sum));
}

template <bool kFifthBit>
float slice_k45(const uint8_t* row, int s, const RoundedX& x) {
  const int sb = s / 8, inner = s % 8, g = inner / 2;
  const size_t block_bytes = kFifthBit ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  const uint8_t* block = row + sb * block_bytes;
  const uint8_t* scales = block + 4;
  const uint8_t* qs = block + (kFifthBit ? offsetof(BlockQ5_K, qs) : offsetof(BlockQ4_K, qs)) + 16 * inner;
  const uint8_t* qh = block + offsetof(BlockQ5_K, qh) + 16 * (inner % 2);
  const int lo_base = 256 * sb + 64 * g + 16 * (inner % 2), hi_base = lo_base + 32;
  int dot_lo = 0, dot_hi = 0;
  for (int i = 0; i < 16; ++i) {
    int lo = qs[i] & 15, hi = qs[i] >> 4;
    if constexpr (kFifthBit) {
      lo |= ((qh[i] >> (2 * g)) & 1) << 4;
      hi |= ((qh[i] >> (2 * g + 1)) & 1) << 4;
    }
    dot_lo += lo * int(x.q[lo_base + i]);
    dot_hi += hi * int(x.q[hi_base + i]);
  }
  int sc_lo, m_lo, sc_hi, m_hi;
  scale_min_k4(scales, 2 * g, &sc_lo, &m_lo);
  scale_min_k4(scales, 2 * g + 1, &sc_hi, &m_hi);
  const int scaled = sc_lo * dot_lo + sc_hi * dot_hi;
  const int mins = m_lo * x.sum16[lo_base / 16] + m_hi * x.sum16[hi_base / 16];
  const float d = half_at(block), dmin = half_at(block + 2);
  return exact::mul(x.d[lo_base / 32], exact::sub(exact::mul(d, float(scaled)), exact::mul(dmin, float(mins))));
}

float slice_q6_k(const uint8_t* row, int s, const RoundedX& x) {
  const int blk = s / 8, half = (s % 8) / 4, t = s % 4;
  const uint8_t* block = row + blk * sizeof(BlockQ6_K);
  const uint8_t* ql = block + 64 * half + 8 * t;
  const uint8_t* qh = block + offsetof(BlockQ6_K, qh) + 32 * half + 8 * t;
  const int8_t* scales = reinterpret_cast<const int8_t*>(block + offsetof(BlockQ6_K, scales)) + 8 * half + t / 2;
  const int base = 256 * blk + 128 * half + 8 * t;
  int total = 0;
  for (int quarter = 0; quarter < 4; ++quarter) {
    int dot = 0, sum = 0;
    for (int j = 0; j < 8; ++j) {
      const int low = quarter % 2 ? ql[32 + j] : ql[j];
      const int u = (quarter < 2 ? low & 15 : low >> 4) | ((qh[j] >> (2 * quarter)) & 3) << 4;
      const int xv = x.q[base + 32 * quarter + j];
      dot += u * xv;
      sum += xv;
    }
    total += int(scales[2 * quarter]) * (dot - 32 * sum);
  }
  return exact::mul(exact::mul(half_at(block + offsetof(BlockQ6_K, d)), x.d[8 * blk]), float(total));
}

float slice_dot(GgmlType type, const uint8_t* row, int s, const RoundedX& x) {
  switch (type) {
    case GgmlType::Q8_0: return slice_q8_0(row, s, x);
    case GgmlType::Q5_0: return slice_q5_0(row, s, x);
    case GgmlType::Q4_K: return slice_k45<false>(row, s, x);
    case GgmlType::Q5_K: return slice_k45<true>(row, s, x);
    case GgmlType::Q6_K: return slice_q6_k(row, s, x);
    default: fail("q8 twin: no product for {} weights", traits(type).name);
  }
}

// The GPU's Q8_0 kernel for rows in spans (quant::q8_0_in_spans, matvec_q8_0_spans_kernel): span
// s is blocks 8 s .. 8 s + 7, each block's term d * x.d * (its integer sum) added from 0 in order;
// lane i of lanes_for(spans) adds spans i, i + lanes, ..., then the butterfly.
float span_q8_0(const uint8_t* row, int64_t span, const RoundedX& x) {
  float sum = 0.0f;
  for (int64_t b = kQ8_0SpanBlocks * span; b < kQ8_0SpanBlocks * (span + 1); ++b) {
    const uint8_t* block = row + b * int64_t(sizeof(BlockQ8_0));
    const int8_t* q = reinterpret_cast<const int8_t*>(block + 2);
    int dot = 0;
    for (int i = 0; i < 32; ++i) dot += int(q[i]) * int(x.q[32 * b + i]);
    sum = exact::add(sum, exact::mul(exact::mul(half_at(block), x.d[b]), float(dot)));
  }
  return sum;
}

float row_dot_q8_0_spans(const uint8_t* row, int64_t cols, const RoundedX& x) {
  const int64_t spans = cols / kQ8_0SpanValues;
  const int lanes = lanes_for(spans);
  float lane_sum[32];
  for (int i = 0; i < lanes; ++i) {
    float sum = 0.0f;
    for (int64_t s = i; s < spans; s += lanes) sum = exact::add(sum, span_q8_0(row, s, x));
    lane_sum[i] = sum;
  }
  return butterfly(lane_sum, lanes);
}

}  // namespace

RoundedBuffer::RoundedBuffer(int64_t cols) {
  const size_t q = aligned64(size_t(cols)), d = aligned64(size_t(cols / 32) * 4), sums = aligned64(size_t(cols / 16) * 4);
  memory_.resize(q + d + sums + 64);
  uint8_t* base = memory_.data() + (64 - reinterpret_cast<uintptr_t>(memory_.data()) % 64) % 64;
  x_.q = reinterpret_cast<int8_t*>(base);
  x_.d = reinterpret_cast<float*>(base + q);
  x_.sum16 = reinterpret_cast<int32_t*>(base + q + d);
}

void round(GgmlType type, const float* x, const float* up, int64_t cols, RoundedX out) {
  const int64_t block = q8_0_blocks(type) ? 32 : 256;
  float v[256];
  for (int64_t base = 0; base < cols; base += block) {
    float amax = 0.0f;
    for (int64_t j = 0; j < block; ++j) {
      v[j] = up ? exact::swiglu(x[base + j], up[base + j]) : x[base + j];
      amax = std::max(amax, std::fabs(v[j]));
    }
    float d, iscale;
    if (block == 32) {
      d = fp16_to_fp32(fp32_to_fp16(exact::div(amax, 127.0f)));
      iscale = amax != 0.0f ? exact::div(127.0f, amax) : 0.0f;
    } else {  // the sign of the extreme value cancels in d * q
      iscale = amax != 0.0f ? exact::div(-127.0f, amax) : 0.0f;
      d = amax != 0.0f ? exact::div(1.0f, iscale) : 0.0f;
    }
    for (int64_t j = 0; j < block; ++j)
      out.q[base + j] = int8_t(std::min(127, int(exact::round_even(exact::mul(iscale, v[j])))));
    for (int64_t j = 0; j < block; j += 32) out.d[(base + j) / 32] = d;
    for (int64_t j = 0; j < block; j += 16) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += out.q[base + j + i];
      out.sum16[(base + j) / 16] = sum;
    }
  }
}

float row_dot(GgmlType type, const uint8_t* row, int64_t cols, const RoundedX& x) {
  if (type == GgmlType::Q8_0 && q8_0_in_spans(cols)) return row_dot_q8_0_spans(row, cols, x);
  const int64_t slices = cols / slice_values(type);
  const int lanes = lanes_for(slices);
  float lane_sum[32];
  for (int i = 0; i < lanes; ++i) {
    float sum = 0.0f;
    for (int64_t s = i; s < slices; s += lanes) sum = exact::add(sum, slice_dot(type, row, int(s), x));
    lane_sum[i] = sum;
  }
  return butterfly(lane_sum, lanes);
}

void rows(GgmlType type, const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t cols, const RoundedX& x,
          float* y) {
  if (const fast::RowsKernel kernel = fast::kernel_for(type, cols)) return kernel(w, row_bytes, n_rows, cols, x, y);
  for (int64_t r = 0; r < n_rows; ++r) y[r] = row_dot(type, w + size_t(r) * row_bytes, cols, x);
}

const char* kernel_name(GgmlType type) { return fast::kernel_for(type, 256) ? fast::kIsaName : "reference"; }

}  // namespace lode::cpu::q8twin
