// The kernels behind cuda/matvec.h. Each weight type says how to dot one 32-value unit of a row
// (a Q8_0/Q4_0 block, a Q4_K/Q5_K sub-block, a quarter of a Q6_K half, 32 plain values) with x.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "core/quant/blocks.h"
#include "cuda/matvec_launch.h"

namespace lode::cuda {

namespace {

using namespace lode::quant;

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4;

__device__ __forceinline__ float half_bits(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

// Q4_K / Q5_K sub-block j's 6-bit scale and min (the 12-byte packing of kquants_scales.h).
__device__ __forceinline__ void scale_min_k4(const uint8_t* packed, int j, float* scale, float* min) {
  if (j < 4) {
    *scale = float(packed[j] & 63);
    *min = float(packed[j + 4] & 63);
  } else {
    *scale = float((packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4));
    *min = float((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
  }
}

template <GgmlType T>
struct Unit;

template <>
struct Unit<GgmlType::F32> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float* x) {
    const float* w = reinterpret_cast<const float*>(row) + u * 32;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) s += w[j] * x[j];
    return s;
  }
};

template <>
struct Unit<GgmlType::F16> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float* x) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row) + u * 32;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) s += half_bits(w[j]) * x[j];
    return s;
  }
};

template <>
struct Unit<GgmlType::BF16> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float* x) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(row) + u * 32;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) s += __uint_as_float(uint32_t(w[j]) << 16) * x[j];
    return s;
  }
};

template <>
struct Unit<GgmlType::Q8_0> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float* x) {
    const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[u];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) s += float(b.qs[j]) * x[j];
    return half_bits(b.d) * s;
  }
};

template <>
struct Unit<GgmlType::Q4_0> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float* x) {
    const BlockQ4_0& b = reinterpret_cast<const BlockQ4_0*>(row)[u];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      s += float(int(b.qs[j] & 0x0f) - 8) * x[j];
      s += float(int(b.qs[j] >> 4) - 8) * x[j + 16];
    }
    return half_bits(b.d) * s;
  }
};

template <>
struct Unit<GgmlType::Q4_K> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float* x) {
    const BlockQ4_K& b = reinterpret_cast<const BlockQ4_K*>(row)[u / 8];
    const int sub = int(u % 8);
    float scale, min;
    scale_min_k4(b.scales, sub, &scale, &min);
    const uint8_t* qs = b.qs + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    float s = 0.0f, sx = 0.0f;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      s += float((qs[l] >> shift) & 0x0f) * x[l];
      sx += x[l];
    }
    return half_bits(b.d) * scale * s - half_bits(b.dmin) * min * sx;
  }
};

template <>
struct Unit<GgmlType::Q5_K> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float* x) {
    const BlockQ5_K& b = reinterpret_cast<const BlockQ5_K*>(row)[u / 8];
    const int sub = int(u % 8);
    float scale, min;
    scale_min_k4(b.scales, sub, &scale, &min);
    const uint8_t* qs = b.qs + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    float s = 0.0f, sx = 0.0f;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int q = ((qs[l] >> shift) & 0x0f) | (((b.qh[l] >> sub) & 1) << 4);
      s += float(q) * x[l];
      sx += x[l];
    }
    return half_bits(b.d) * scale * s - half_bits(b.dmin) * min * sx;
  }
};

template <>
struct Unit<GgmlType::Q6_K> {
  __device__ static float dot(const uint8_t* row, int64_t u, const float* x) {
    const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[u / 8];
    const int unit = int(u % 8), half = unit / 4, quarter = unit % 4;
    const uint8_t* low = b.ql + 64 * half + 32 * (quarter % 2);
    const uint8_t* qh = b.qh + 32 * half;
    const int low_shift = 4 * (quarter / 2), high_shift = 2 * quarter;
    float s0 = 0.0f, s1 = 0.0f;  // the unit's two 16-value sub-blocks
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int q = (((low[l] >> low_shift) & 0x0f) | (((qh[l] >> high_shift) & 3) << 4)) - 32;
      (l < 16 ? s0 : s1) += float(q) * x[l];
    }
    const int sub = 8 * half + 2 * quarter;
    return half_bits(b.d) * (float(b.scales[sub]) * s0 + float(b.scales[sub + 1]) * s1);
  }
};

template <GgmlType T>
__global__ void matvec_kernel(const uint8_t* w, int64_t rows, int64_t units, size_t row_bytes, const float* x,
                              float* y) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int64_t t = blockIdx.y;
  if (r >= rows) return;
  const uint8_t* row = w + r * row_bytes;
  const float* xt = x + t * units * 32;
  float sum = 0.0f;
  for (int64_t u = lane; u < units; u += kWarp) sum += Unit<T>::dot(row, u, xt + u * 32);
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) y[t * rows + r] = sum;
}

template <GgmlType T>
cudaError_t launch(const MatvecLaunch& m) {
  const dim3 grid(unsigned((m.rows + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(m.n_tokens));
  matvec_kernel<T><<<grid, kRowsPerBlock * kWarp, 0, static_cast<cudaStream_t>(m.stream)>>>(
      static_cast<const uint8_t*>(m.w), m.rows, m.cols / 32, m.row_bytes, m.x, m.y);
  return cudaGetLastError();
}

}  // namespace

bool matvec_kernel_exists(GgmlType type) {
  switch (type) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::Q4_0:
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

const char* launch_matvec(const MatvecLaunch& m) {
  cudaError_t err = cudaErrorInvalidValue;
  switch (m.type) {
    case GgmlType::F32: err = launch<GgmlType::F32>(m); break;
    case GgmlType::F16: err = launch<GgmlType::F16>(m); break;
    case GgmlType::BF16: err = launch<GgmlType::BF16>(m); break;
    case GgmlType::Q8_0: err = launch<GgmlType::Q8_0>(m); break;
    case GgmlType::Q4_0: err = launch<GgmlType::Q4_0>(m); break;
    case GgmlType::Q4_K: err = launch<GgmlType::Q4_K>(m); break;
    case GgmlType::Q5_K: err = launch<GgmlType::Q5_K>(m); break;
    case GgmlType::Q6_K: err = launch<GgmlType::Q6_K>(m); break;
    default: return "no kernel for this type";
  }
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace lode::cuda
