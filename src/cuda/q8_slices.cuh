// The 8-bit-activation products' building blocks (matvec_q8_kernels.cu): x rounded into shared
// memory the way ggml's CPU path rounds activations for the weight's type (cpu/activation_rounding.h:
// Q8_0 blocks of 32 for Q8_0 and Q5_0 weights, Q8_K blocks of 256 for the K-quants), and each
// type's "slice" of a row (8 values of a Q8_0 or Q5_0 block, 32 values of a K-quant super-block),
// laid out so that neighbouring lanes read neighbouring bytes, loaded into registers and dotted
// with those int8 values four at a time (dp4a), each integer sum scaled once.
//
// Every float step is rounded on its own (core/exact_math.h): the CPU miss path
// (cpu/q8_twin.h) computes an expert's products on the host with this arithmetic, in this
// order, and must get the same bits. Included by matvec_q8_kernels.cu and matvec_q8_tile_kernels.cu.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/exact_math.h"
#include "core/quant/blocks.h"
#include "core/quant/types.h"
#include "cuda/kernel_math.cuh"

namespace lode::cuda {
namespace {

using namespace lode::quant;

using kernels::input_value;
using kernels::kWarp;

// Where a slice's bytes are read: weights in global memory, or rows a block has staged in shared
// memory. A decode step reads each weight once, so the loads are streaming (ld.global.cs: L2 evicts
// those lines first, before what the step reads again or asked L2 for ahead; copy_async's kOnce,
// docs/PERFORMANCE.md).
struct FromGlobal {
  template <class W>
  __device__ static W at(const void* p) { return __ldcs(static_cast<const W*>(p)); }
};
struct FromShared {
  template <class W>
  __device__ static W at(const void* p) { return *static_cast<const W*>(p); }
};

template <class M>
__device__ __forceinline__ float half_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(M::template at<uint16_t>(p)));
}

// Four bytes at a 2-byte aligned address.
template <class M>
__device__ __forceinline__ int u32_at_b2(const uint8_t* p) {
  return int(uint32_t(M::template at<uint16_t>(p)) | (uint32_t(M::template at<uint16_t>(p + 2)) << 16));
}

// Eight bytes at a 2-byte aligned address as two words, from the aligned 4-byte words that hold
// them: two or three loads where 2-byte pieces took four (never a byte past the eight's words).
template <class M>
__device__ __forceinline__ uint2 u64_at_b2(const uint8_t* p) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(at & ~uintptr_t(3));
  const unsigned shift = unsigned(at & 3) * 8;
  const uint32_t w0 = M::template at<uint32_t>(w), w1 = M::template at<uint32_t>(w + 1),
                 w2 = shift ? M::template at<uint32_t>(w + 2) : 0u;
  return {__funnelshift_r(w0, w1, shift), __funnelshift_r(w1, w2, shift)};
}

enum class XRounding { q8_0, q8_k };

// x of one problem rounded in shared memory: q [cols] int8; d [cols / 32]: the scale of each 32
// values (Q8_K: its 256-block's scale repeated); sum16 [cols / 16]: the sum of each 16 q.
struct RoundedX {
  int8_t* q;
  float* d;
  int* sum16;
};

// A block's RoundedX in its dynamic shared memory: q_bytes of q, then d, then sum16; and the bytes
// that takes.
__host__ __device__ constexpr size_t rounded_x_bytes(size_t q_bytes, int64_t cols) {
  return q_bytes + size_t(cols / 32) * 4 + size_t(cols / 16) * 4;
}
// Several inputs' RoundedX one after another: input i's at i times this many 16-byte words (each
// input's bytes rounded up, so that every input's q starts 16-byte aligned).
__host__ __device__ constexpr size_t rounded_x_words(size_t q_bytes, int64_t cols) {
  return (rounded_x_bytes(q_bytes, cols) + 15) / 16;
}
// The words of a RoundedX's q and d alone, for a reader that takes no sums (its sum16 follows them).
__host__ __device__ constexpr size_t rounded_x_words_before_sums(size_t q_bytes, int64_t cols) {
  return (q_bytes + size_t(cols / 32) * 4 + 15) / 16;
}
// The bytes `inputs` such RoundedX take one after another, each in whole words (rounded inputs are
// copied in whole words: copy_rounded).
constexpr size_t inputs_x_bytes(int inputs, size_t q_bytes, int64_t cols) {
  return size_t(inputs) * 16 * rounded_x_words(q_bytes, cols);
}
__device__ __forceinline__ RoundedX rounded_x_in(int4* shared, size_t q_bytes, int64_t cols) {
  RoundedX rx;
  rx.q = reinterpret_cast<int8_t*>(shared);
  rx.d = reinterpret_cast<float*>(rx.q + q_bytes);
  rx.sum16 = reinterpret_cast<int*>(rx.d + cols / 32);
  return rx;
}

// A rounded input's words from round_inputs_kernel's output (in L2) into the block's shared memory;
// a __syncthreads() later the block may read them.
__device__ __forceinline__ void copy_rounded(int4* to, const int4* from, size_t words) {
  for (size_t w = threadIdx.x; w < words; w += blockDim.x) to[w] = __ldcg(from + w);
}

// The lanes that share a row of `slices` slices (spans): the largest power of two <= min(32,
// slices), as the host twin counts them.
inline int lanes_for(int64_t slices) {
  int lanes = kWarp;
  while (lanes > 1 && lanes > slices) lanes /= 2;
  return lanes;
}

__device__ __forceinline__ int pack4(int a, int b, int c, int d) {
  return int((uint32_t(a) & 0xff) | ((uint32_t(b) & 0xff) << 8) | ((uint32_t(c) & 0xff) << 16) | (uint32_t(d) << 24));
}

// Each warp takes 256-value chunks, lane l values 8l .. 8l + 7 of the chunk. cols is a multiple of
// 32 (Q8_0) or of 256 (Q8_K), so a 32-value block never straddles lanes that skip. kRowLayout: q is
// laid out like a Q8_0 row (value i at byte 34 (i / 32) + 2 + i % 32, zeros where a row keeps its
// scales), so a weight word and the x word at the same offset pair up in one dp4a.
template <XRounding R, bool kRowLayout = false>
__device__ void round_x(const float* x, int64_t cols, int64_t swiglu_up, RoundedX out) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  for (int64_t chunk = warp; chunk * 256 < cols; chunk += warps) {
    const int64_t base = chunk * 256 + 8 * lane;
    const bool inside = base < cols;
    float v[8], amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[j] = inside ? input_value(x, base + j, swiglu_up) : 0.0f;
      amax = fmaxf(amax, fabsf(v[j]));
    }
    float d, iscale;
    if constexpr (R == XRounding::q8_0) {  // max over the 4 lanes of a 32-value block
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      d = __half2float(__float2half_rn(amax / 127.0f));
      iscale = amax != 0.0f ? 127.0f / amax : 0.0f;
    } else {  // max over the warp's 256 values; the sign of the extreme value cancels in d * q
      amax = kernels::warp_max(amax);
      iscale = amax != 0.0f ? -127.0f / amax : 0.0f;
      d = amax != 0.0f ? 1.0f / iscale : 0.0f;
    }
    int q[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      q[j] = min(127, __float2int_rn(iscale * v[j]));
      sum += q[j];
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // lanes 2m, 2m + 1: 16 values
    if (!inside) continue;
    if constexpr (kRowLayout) {
      const int64_t block = base / 32, at = block * int64_t(sizeof(BlockQ8_0)) + 2 + base % 32;
#pragma unroll
      for (int j = 0; j < 8; ++j) out.q[at + j] = int8_t(q[j]);
      if (lane % 4 == 0) out.q[at - 2] = 0, out.q[at - 1] = 0;
    } else {
      int* words = reinterpret_cast<int*>(out.q + base);
      words[0] = pack4(q[0], q[1], q[2], q[3]);
      words[1] = pack4(q[4], q[5], q[6], q[7]);
    }
    if (lane % 4 == 0) out.d[base / 32] = d;
    if (lane % 2 == 0) out.sum16[base / 16] = sum;
  }
}

// Q4_K / Q5_K sub-blocks 2 g and 2 g + 1: their 6-bit scales (bytes 0 and 1 of *scales) and mins
// (likewise *mins), from the 12 packed bytes (words w0, w1, w2). Sub-blocks 0-3 keep their scale in
// the low 6 bits of bytes 0-3 and their min in bytes 4-7; sub-blocks 4-7 their low 4 bits in the
// nibbles of bytes 8-11 and their top two bits in the top bits of bytes 0-7. Neighbouring lanes
// take different g; nvcc 13 makes the if below a branch (SASS, stop 63), and a form without one
// (both sides, then a mask) measured no faster (bench_cuda_matvec "by group", steps of 16 and 64
// sequences, tg32, on an H100).
__device__ __forceinline__ void scale_min_pair_k4(uint32_t w0, uint32_t w1, uint32_t w2, int g, uint32_t* scales,
                                                  uint32_t* mins) {
  const int shift = 16 * (g & 1);
  const uint32_t p0 = w0 >> shift, p1 = w1 >> shift, p2 = w2 >> shift;
  if (g < 2) {
    *scales = p0 & 0x3f3fu, *mins = p1 & 0x3f3fu;
  } else {
    *scales = (p2 & 0x0f0fu) | ((p0 >> 2) & 0x3030u);
    *mins = ((p2 >> 4) & 0x0f0fu) | ((p1 >> 2) & 0x3030u);
  }
}

// Each type's slice in three steps: load() reads the slice's bytes of a row into registers (Raw),
// ready() unpacks them (its codes as int8 words, its scales), dot() dots that with one input's x.
// The kernel issues its first pass's loads before it rounds x (and, for a plain matrix, before it
// waits for the kernel before it), so the weights' first trip to memory overlaps everything else
// the block does first; a slice dotted with several inputs is unpacked once for all of them.
// dot(raw, s, x) is dot(ready(raw, s), s, x), and dot(ready, s, x) is dot(ready, x_at(s, x)): x_at()
// reads the slice's x (and what of its sums needs no weight) once, for a kernel that dots it with
// several rows. Slice indices are unsigned in the arithmetic (they are never negative, and signed
// divisions cost fix-ups).
template <GgmlType T>
struct Slice;

// Q8_0: 8 values (a quarter of a block) per slice, so four neighbouring lanes read one block.
template <>
struct Slice<GgmlType::Q8_0> {
  static constexpr int kValues = 8;
  static constexpr XRounding kRounding = XRounding::q8_0;
  struct Raw {
    int q0, q1;
    float d;
  };
  template <class M = FromGlobal>
  __device__ static Raw load(const uint8_t* row, int s) {
    const uint8_t* block = row + (s / 4) * int(sizeof(BlockQ8_0));
    const uint8_t* q = block + 2 + 8 * (s % 4);
    const uint2 pair = u64_at_b2<M>(q);
    return {int(pair.x), int(pair.y), half_at<M>(block)};
  }
  using Ready = Raw;  // (already int8 words)
  __device__ static Ready ready(const Raw& r, int) { return r; }
  struct Xs {
    int2 q;
    float d;
  };
  __device__ static Xs x_at(int s, RoundedX x) {
    const unsigned b = unsigned(s) / 4;
    return {*reinterpret_cast<const int2*>(x.q + 32 * b + 8 * (unsigned(s) % 4)), x.d[b]};
  }
  __device__ static float dot(const Ready& r, const Xs& x) {
    const int sum = __dp4a(r.q1, x.q.y, __dp4a(r.q0, x.q.x, 0));
    return exact::mul(exact::mul(r.d, x.d), float(sum));
  }
  __device__ static float dot(const Ready& r, int s, RoundedX x) { return dot(r, x_at(s, x)); }
};

// Q5_0: 8 values per slice as for Q8_0. Part t = s % 4 of a block holds values 8 t .. 8 t + 7: the
// low (t < 2) or high nibbles of qs[8 (t % 2) .. + 7], each with its fifth bit (bit 8 t + j of qh),
// all minus 16: sum (u - 16) x = sum u x - 16 sum x.
template <>
struct Slice<GgmlType::Q5_0> {
  static constexpr int kValues = 8;
  static constexpr XRounding kRounding = XRounding::q8_0;
  struct Raw {
    uint32_t qh, qs[2];
    float d;
  };
  template <class M = FromGlobal>
  __device__ static Raw load(const uint8_t* row, int s) {
    const uint8_t* block = row + (s / 4) * int(sizeof(BlockQ5_0));
    const uint8_t* qs = block + 6 + 8 * (s % 4 % 2);
    const uint2 pair = u64_at_b2<M>(qs);
    return {uint32_t(u32_at_b2<M>(block + 2)), {pair.x, pair.y}, half_at<M>(block)};
  }
  struct Ready {
    uint32_t u[2];  // the 8 values plus 16, as bytes
    float d;
  };
  __device__ static Ready ready(const Raw& r, int s) {
    const unsigned part = unsigned(s) % 4;
    const uint32_t qh = r.qh >> (8 * part);
    Ready w;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t nibbles = (part < 2 ? r.qs[i] : r.qs[i] >> 4) & 0x0f0f0f0fu;
      const uint32_t fifth = ((((qh >> (4 * i)) & 0x0fu) * 0x00204081u) & 0x01010101u) << 4;  // bit j to byte j
      w.u[i] = nibbles | fifth;
    }
    w.d = r.d;
    return w;
  }
  struct Xs {
    int q[2];
    int sum;  // of the 8 values
    float d;
  };
  __device__ static Xs x_at(int s, RoundedX x) {
    const unsigned b = unsigned(s) / 4;
    const int2 q = *reinterpret_cast<const int2*>(x.q + 32 * b + 8 * (unsigned(s) % 4));
    return {{q.x, q.y}, __dp4a(0x01010101, q.y, __dp4a(0x01010101, q.x, 0)), x.d[b]};
  }
  __device__ static float dot(const Ready& w, const Xs& x) {
    const int dot = __dp4a(int(w.u[1]), x.q[1], __dp4a(int(w.u[0]), x.q[0], 0));
    return exact::mul(exact::mul(w.d, x.d), float(dot - 16 * x.sum));
  }
  __device__ static float dot(const Ready& w, int s, RoundedX x) { return dot(w, x_at(s, x)); }
  __device__ static float dot(const Raw& r, int s, RoundedX x) { return dot(ready(r, s), s, x); }
};

// K4/K5 slice s of a super-block (s counted within the row): 16 bytes of qs holding values
// 16 (s % 2) .. + 15 of sub-blocks 2 g and 2 g + 1, g = s % 8 / 2 (low and high nibbles); head: the
// super-block's first 16 bytes (d, dmin, the 12 scale bytes). kFifthBit: h holds Q5_K's fifth bits.
// Unpacked: the 16 low and 16 high values as bytes, the two sub-blocks' scales and mins.
struct K45Ready {
  uint32_t lo[4], hi[4];
  int scale_lo, scale_hi, min_lo, min_hi;
  float d, dmin;
};
template <bool kFifthBit>
__device__ __forceinline__ K45Ready k45_ready(uint4 head, uint4 q, uint4 h, int s) {
  const unsigned g = unsigned(s) % 8 / 2;
  const uint32_t qw[4] = {q.x, q.y, q.z, q.w}, hw[4] = {h.x, h.y, h.z, h.w};
  K45Ready w;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w.lo[i] = qw[i] & 0x0f0f0f0fu, w.hi[i] = (qw[i] >> 4) & 0x0f0f0f0fu;
    if constexpr (kFifthBit) {
      w.lo[i] |= ((hw[i] >> (2 * g)) & 0x01010101u) << 4;
      w.hi[i] |= ((hw[i] >> (2 * g + 1)) & 0x01010101u) << 4;
    }
  }
  uint32_t scales, mins;
  scale_min_pair_k4(head.y, head.z, head.w, int(g), &scales, &mins);
  w.scale_lo = int(scales & 0xffu), w.scale_hi = int(scales >> 8), w.min_lo = int(mins & 0xffu), w.min_hi = int(mins >> 8);
  w.d = __half2float(__ushort_as_half(uint16_t(head.x)));
  w.dmin = __half2float(__ushort_as_half(uint16_t(head.x >> 16)));
  return w;
}
// x's part of K4/K5 slice s: its 16 low and 16 high values (one 16-byte shared load each: x.q is
// 16-byte aligned), their sums and their scale.
struct K45X {
  int4 lo, hi;
  int sum_lo, sum_hi;
  float d;
};
__device__ __forceinline__ K45X k45_x(int s, RoundedX x) {
  const unsigned us = unsigned(s), g = us % 8 / 2;
  const unsigned lo = 256 * (us / 8) + 64 * g + 16 * (us % 2), hi = lo + 32;
  return {*reinterpret_cast<const int4*>(x.q + lo), *reinterpret_cast<const int4*>(x.q + hi), x.sum16[lo / 16],
          x.sum16[hi / 16], x.d[lo / 32]};
}
__device__ __forceinline__ float k45_dot(const K45Ready& w, const K45X& x) {
  const int xlw[4] = {x.lo.x, x.lo.y, x.lo.z, x.lo.w}, xhw[4] = {x.hi.x, x.hi.y, x.hi.z, x.hi.w};
  int dot_lo = 0, dot_hi = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    dot_lo = __dp4a(int(w.lo[i]), xlw[i], dot_lo);
    dot_hi = __dp4a(int(w.hi[i]), xhw[i], dot_hi);
  }
  const int scaled = w.scale_lo * dot_lo + w.scale_hi * dot_hi;
  const int sum_mins = w.min_lo * x.sum_lo + w.min_hi * x.sum_hi;
  return exact::mul(x.d, exact::sub(exact::mul(w.d, float(scaled)), exact::mul(w.dmin, float(sum_mins))));
}

template <>
struct Slice<GgmlType::Q4_K> {
  static constexpr int kValues = 32;
  static constexpr XRounding kRounding = XRounding::q8_k;
  struct Raw {
    uint4 head, q;
  };
  template <class M = FromGlobal>
  __device__ static Raw load(const uint8_t* row, int s) {
    const BlockQ4_K& b = reinterpret_cast<const BlockQ4_K*>(row)[s / 8];
    return {M::template at<uint4>(&b), M::template at<uint4>(reinterpret_cast<const uint4*>(b.qs) + s % 8)};
  }
  using Ready = K45Ready;
  __device__ static Ready ready(const Raw& r, int s) { return k45_ready<false>(r.head, r.q, uint4{}, s); }
  using Xs = K45X;
  __device__ static Xs x_at(int s, RoundedX x) { return k45_x(s, x); }
  __device__ static float dot(const Ready& w, const Xs& x) { return k45_dot(w, x); }
  __device__ static float dot(const Ready& w, int s, RoundedX x) { return k45_dot(w, k45_x(s, x)); }
  __device__ static float dot(const Raw& r, int s, RoundedX x) { return dot(ready(r, s), s, x); }
};

template <>
struct Slice<GgmlType::Q5_K> {
  static constexpr int kValues = 32;
  static constexpr XRounding kRounding = XRounding::q8_k;
  struct Raw {
    uint4 head, q, h;
  };
  template <class M = FromGlobal>
  __device__ static Raw load(const uint8_t* row, int s) {
    const BlockQ5_K& b = reinterpret_cast<const BlockQ5_K*>(row)[s / 8];
    return {M::template at<uint4>(&b), M::template at<uint4>(reinterpret_cast<const uint4*>(b.qs) + s % 8),
            M::template at<uint4>(reinterpret_cast<const uint4*>(b.qh) + s % 2)};
  }
  using Ready = K45Ready;
  __device__ static Ready ready(const Raw& r, int s) { return k45_ready<true>(r.head, r.q, r.h, s); }
  using Xs = K45X;
  __device__ static Xs x_at(int s, RoundedX x) { return k45_x(s, x); }
  __device__ static float dot(const Ready& w, const Xs& x) { return k45_dot(w, x); }
  __device__ static float dot(const Ready& w, int s, RoundedX x) { return k45_dot(w, k45_x(s, x)); }
  __device__ static float dot(const Raw& r, int s, RoundedX x) { return dot(ready(r, s), s, x); }
};

// Q6_K slice s of a block: half s / 4, positions l = 8 (s % 4) .. + 7 of its four 32-value
// quarters (low/high nibbles of ql[l] and ql[32 + l], two bits each of qh[l]). Values are stored
// plus 32: sum (u - 32) x = sum u x - 32 sum x.
template <>
struct Slice<GgmlType::Q6_K> {
  static constexpr int kValues = 32;
  static constexpr XRounding kRounding = XRounding::q8_k;
  struct Raw {
    uint2 a, b, h;
    uint2 scales;  // the half's 8 scale bytes: quarter q's at t / 2 + 2 q
    float d;
  };
  // Each 8-byte piece from its aligned words (blocks of 210 bytes start on 2-byte boundaries).
  template <class M = FromGlobal>
  __device__ static Raw load(const uint8_t* row, int s) {
    const int half = (s % 8) / 4, t = s % 4;
    const uint8_t* block = row + (s / 8) * int(sizeof(BlockQ6_K));
    const uint8_t* ql = block + 64 * half + 8 * t;
    const uint8_t* qh = block + offsetof(BlockQ6_K, qh) + 32 * half + 8 * t;
    return {u64_at_b2<M>(ql), u64_at_b2<M>(ql + 32), u64_at_b2<M>(qh),
            u64_at_b2<M>(block + offsetof(BlockQ6_K, scales) + 8 * half), half_at<M>(block + offsetof(BlockQ6_K, d))};
  }
  struct Ready {
    uint32_t u[2][4];  // word w of quarter q's 8 values (plus 32), as bytes
    int scale[4];      // quarter q's signed scale
    float d;
  };
  __device__ static Ready ready(const Raw& r, int s) {
    const unsigned t = unsigned(s) % 4;
    Ready w;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t a = i == 0 ? r.a.x : r.a.y, b = i == 0 ? r.b.x : r.b.y, h = i == 0 ? r.h.x : r.h.y;
      w.u[i][0] = (a & 0x0f0f0f0fu) | ((h & 0x03030303u) << 4);
      w.u[i][1] = (b & 0x0f0f0f0fu) | (((h >> 2) & 0x03030303u) << 4);
      w.u[i][2] = ((a >> 4) & 0x0f0f0f0fu) | (((h >> 4) & 0x03030303u) << 4);
      w.u[i][3] = ((b >> 4) & 0x0f0f0f0fu) | (((h >> 6) & 0x03030303u) << 4);
    }
#pragma unroll
    for (int quarter = 0; quarter < 4; ++quarter) {
      const uint32_t word = quarter < 2 ? r.scales.x : r.scales.y;
      w.scale[quarter] = int(word << (24 - 8 * (t / 2 + 2 * (quarter % 2)))) >> 24;  // the signed byte
    }
    w.d = r.d;
    return w;
  }
  struct Xs {
    int2 q[4];   // each quarter's 8 values
    int sum[4];  // and their sums
    float d;
  };
  __device__ static Xs x_at(int s, RoundedX x) {
    const unsigned us = unsigned(s), blk = us / 8, half = us % 8 / 4, t = us % 4;
    const unsigned base = 256 * blk + 128 * half + 8 * t;
    Xs xs;
#pragma unroll
    for (int quarter = 0; quarter < 4; ++quarter) {  // one 8-byte shared load each (base is a multiple of 8)
      xs.q[quarter] = *reinterpret_cast<const int2*>(x.q + base + 32 * quarter);
      xs.sum[quarter] = __dp4a(0x01010101, xs.q[quarter].y, __dp4a(0x01010101, xs.q[quarter].x, 0));
    }
    xs.d = x.d[8 * blk];
    return xs;
  }
  __device__ static float dot(const Ready& w, const Xs& x) {
    int total = 0;
#pragma unroll
    for (int quarter = 0; quarter < 4; ++quarter) {
      const int dot = __dp4a(int(w.u[1][quarter]), x.q[quarter].y, __dp4a(int(w.u[0][quarter]), x.q[quarter].x, 0));
      total += w.scale[quarter] * (dot - 32 * x.sum[quarter]);
    }
    return exact::mul(exact::mul(w.d, x.d), float(total));
  }
  __device__ static float dot(const Ready& w, int s, RoundedX x) { return dot(w, x_at(s, x)); }
  __device__ static float dot(const Raw& r, int s, RoundedX x) { return dot(ready(r, s), s, x); }
};

}  // namespace
}  // namespace lode::cuda
