// AVX2 kernels for q8twin::rows (cpu/q8_twin_fast.h): row_dot's bits, an order of magnitude faster.
//
// Why the bits agree. The integer parts of a slice (its dot products, scaled sums and mins) are
// exact in any order, so they use whatever SIMD sums are quickest: maddubs of unsigned weights with
// signed x, madd to int32 (with the 6-bit scales as the multipliers), hadd trees. The float parts
// are row_dot's operations in row_dot's order, eight slices at a time: since lanes is a multiple of
// 8 (shapes where it is not fall back to row_dot), the GPU's lane i is position i % 8 of
// accumulator i / 8; each position adds its slices in row order starting from 0.0f, and the
// butterfly runs across accumulators (offsets lanes / 2 .. 8), then inside accumulator 0 (offsets
// 4, 2, 1). Q8_0's span form is the exception: its lanes' sums are scalars, added as row_dot adds
// them, whatever the number of lanes. No FMA: the target is avx2 and f16c only and the build passes -ffp-contract=off, so
// every multiply and add rounds on its own. F16C's half-to-float conversion is exact, like
// lode::fp16_to_fp32.
//
// The Q8_0 kernels' sign trick, |w| * (x signed by w), needs x.q in [-127, 127]; round() never
// makes -128 (its scale maps the largest |value| to 127).
#include "cpu/q8_twin_fast.h"

#include <immintrin.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/q8_0_spans.h"
#include "core/host_isa.h"

#define LODE_AVX2 __attribute__((target("avx2,f16c")))
#define LODE_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

namespace lode::cpu::q8twin::fast {

const char* const kIsaName = "avx2";

namespace {

using namespace lode::quant;

// The GPU's lanes per row (as q8_twin.cpp): the largest power of two <= min(32, slices).
int lanes_for(int64_t slices) {
  int lanes = 32;
  while (lanes > 1 && lanes > slices) lanes /= 2;
  return lanes;
}

// One call's rearranged x: on the stack for the row lengths models use, on the heap beyond.
class Scratch {
 public:
  explicit Scratch(size_t bytes) {
    if (bytes > sizeof(stack_)) heap_.resize((bytes + sizeof(Chunk) - 1) / sizeof(Chunk));
  }
  template <class T>
  T* at(size_t byte_offset) {
    uint8_t* base = heap_.empty() ? stack_ : heap_.front().bytes;
    return reinterpret_cast<T*>(base + byte_offset);
  }

 private:
  struct alignas(32) Chunk {
    uint8_t bytes[32];
  };
  alignas(32) uint8_t stack_[16384];
  std::vector<Chunk> heap_;
};

uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

LODE_AVX2_INLINE __m256i loadu(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Sum over pairs of int16 of a * b, into int32 (exact: the callers' products fit).
LODE_AVX2_INLINE __m256i madd(__m256i a, __m256i b) { return _mm256_madd_epi16(a, b); }

// ---- Slice sums and lane sums ------------------------------------------------------------------
//
// The integer reductions (hadd trees) leave a super-block's 8 slices in a vector out of order;
// every per-slice vector (x's scales and sums, the weights' mins) is laid out in the same order, so
// the float steps still pair up, and each row's accumulators are put back in slice order once,
// before the butterfly.

// Where a reduction leaves the slices: position p holds slice slice_at[p], slice i sits at
// position_of[i].
struct SliceOrder {
  int slice_at[8];
  int position_of[8];
};
constexpr SliceOrder kQuadOrder{{0, 2, 4, 6, 1, 3, 5, 7}, {0, 4, 1, 5, 2, 6, 3, 7}};  // slice_sums
constexpr SliceOrder kPairOrder{{0, 1, 4, 5, 2, 3, 6, 7}, {0, 1, 4, 5, 2, 3, 6, 7}};  // pair_sums

// Four slices' int32 sums each from a and b, whose int32 2t, 2t + 1 are slice t's halves (slices
// 0-3 in a, 4-7 in b): in kPairOrder.
LODE_AVX2_INLINE __m256i pair_sums(__m256i a, __m256i b) { return _mm256_hadd_epi32(a, b); }

// Eight slices' int32 sums in kQuadOrder, from four registers that each hold slice 2g's four
// partial sums in their low 128 bits and slice 2g + 1's in their high 128 bits.
LODE_AVX2_INLINE __m256i slice_sums(const __m256i* by_pair) {
  return _mm256_hadd_epi32(_mm256_hadd_epi32(by_pair[0], by_pair[1]), _mm256_hadd_epi32(by_pair[2], by_pair[3]));
}

// Lane 0 after the GPU's butterfly over the 8 * kAcc lanes in acc (positions in `order`):
// v[i] += v[i + o] for o = lanes / 2 .. 1, the offsets of 8 and more being whole accumulators.
template <int kAcc>
LODE_AVX2_INLINE float butterfly(__m256* acc, const SliceOrder& order) {
#pragma GCC unroll 2
  for (int half = kAcc / 2; half > 0; half /= 2)
#pragma GCC unroll 2
    for (int i = 0; i < half; ++i) acc[i] = _mm256_add_ps(acc[i], acc[i + half]);
  const __m256i in_slice_order = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(order.position_of));
  const __m256 lanes = _mm256_permutevar8x32_ps(acc[0], in_slice_order);
  __m128 v = _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps(lanes, 1));  // o = 4
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));                                                  // o = 2
  v = _mm_add_ss(v, _mm_movehdup_ps(v));                                                   // o = 1
  return _mm_cvtss_f32(v);
}

// Asks for the bytes of the row about kPrefetchBytes ahead while this row computes: the loops do
// so little per byte that the hardware prefetcher alone leaves them waiting on memory.
constexpr size_t kPrefetchBytes = 2048;

LODE_AVX2_INLINE void prefetch_row_ahead(const uint8_t* w, size_t row_bytes, int64_t r, int64_t rows,
                                        size_t used_bytes) {
  const int64_t ahead = int64_t((kPrefetchBytes + used_bytes - 1) / used_bytes);
  if (r + ahead >= rows) return;
  const uint8_t* p = w + size_t(r + ahead) * row_bytes;
  for (size_t at = 0; at < used_bytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(p + at), _MM_HINT_T0);
}

// ---- Q4_K and Q5_K ----------------------------------------------------------------------------

// x for K4/K5 rows, rearranged once per call: per super-block, each slice's x scale
// (x.d[lo_base / 32]) and its pair of 16-value sums (sum16 at lo_base / 16 and hi_base / 16) as
// int16, ready for a madd with the slice's (min_lo, min_hi); both in kQuadOrder.
struct K45X {
  const int8_t* q;
  const __m256* d;      // [super-blocks]
  const __m256i* sums;  // [super-blocks]
};

void prepare_k45_x(const RoundedX& x, int64_t n_sb, __m256* d, __m256i* sums) {
  for (int64_t sb = 0; sb < n_sb; ++sb) {
    alignas(32) float slice_d[8];
    alignas(32) int16_t slice_sums16[16];
    for (int p = 0; p < 8; ++p) {
      const int s = kQuadOrder.slice_at[p];
      const int64_t lo_base = 256 * sb + 64 * (s / 2) + 16 * (s % 2);
      slice_d[p] = x.d[lo_base / 32];
      slice_sums16[2 * p] = int16_t(x.sum16[lo_base / 16]);  // |sum| <= 16 * 127
      slice_sums16[2 * p + 1] = int16_t(x.sum16[lo_base / 16 + 2]);
    }
    std::memcpy(&d[sb], slice_d, sizeof slice_d);
    std::memcpy(&sums[sb], slice_sums16, sizeof slice_sums16);
  }
}

// A K4/K5 super-block's 12 packed bytes as [scale 0 .. 7, min 0 .. 7] (scale_min_k4 for j = 0 .. 7):
// j < 4 are the low 6 bits of bytes j and j + 4; j >= 4 take their low 4 bits from byte j + 4's
// nibbles and their top 2 from bits 6-7 of bytes j - 4 and j. Reads 16 bytes (the block goes on).
LODE_AVX2_INLINE __m128i k45_scales_mins(const uint8_t* packed) {
  const __m128i words = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));  // w0 w1 w2 -
  const __m128i low6 = _mm_and_si128(words, _mm_set1_epi8(0x3f));                     // sc 0-3, min 0-3
  const __m128i w2 = _mm_shuffle_epi32(words, _MM_SHUFFLE(2, 2, 2, 2));
  const __m128i nibbles = _mm_and_si128(_mm_srlv_epi32(w2, _mm_setr_epi32(0, 4, 0, 0)), _mm_set1_epi8(0x0f));
  const __m128i top2 = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(words, 6), _mm_set1_epi8(0x03)), 4);
  const __m128i high = _mm_or_si128(nibbles, top2);  // sc 4-7, min 4-7 in words 0 and 1
  return _mm_unpacklo_epi32(low6, high);
}

// The 8 slices of one K4/K5 super-block as slice_k45 computes them, in kQuadOrder. Register g of qs
// holds slices 2g (low half) and 2g + 1 (high half); its low nibbles meet x[64 g .. + 31] and its
// high nibbles x[64 g + 32 .. + 31], sub-blocks 2g and 2g + 1, whose scales weigh every pair in
// the madd (broadcast from memory: a load, not a shuffle).
template <bool kFifthBit>
LODE_AVX2_INLINE __m256 k45_slices(const uint8_t* block, const int8_t* xq, __m256 x_d, __m256i x_sums) {
  const uint8_t* qs = block + (kFifthBit ? offsetof(BlockQ5_K, qs) : offsetof(BlockQ4_K, qs));
  const __m128i scales_mins = k45_scales_mins(block + offsetof(BlockQ4_K, scales));
  alignas(32) int32_t scale_words[8];  // scale j in both int16 of word j
  const __m256i scales = _mm256_cvtepu8_epi32(scales_mins);
  const __m256i doubled = _mm256_or_si256(scales, _mm256_slli_epi32(scales, 16));
  _mm256_store_si256(reinterpret_cast<__m256i*>(scale_words), doubled);
  asm("" : "+m"(scale_words));  // else GCC forwards the store as shuffles, which is what we avoid
  const __m256i low4 = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10);
  __m256i fifth = kFifthBit ? loadu(block + offsetof(BlockQ5_K, qh)) : _mm256_setzero_si256();
  __m256i by_pair[4];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    const __m256i q = loadu(qs + 32 * g);
    __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    if constexpr (kFifthBit) {  // bits 2g and 2g + 1 of qh to bit 4 (fifth is qh >> 2g)
      lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(fifth, 4), bit4));
      hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(fifth, 3), bit4));
      fifth = _mm256_srli_epi16(fifth, 2);
    }
    // Weights <= 31 times x in [-128, 127]: a pair's sum fits int16.
    const __m256i lo_x = _mm256_maddubs_epi16(lo, loadu(xq + 64 * g));
    const __m256i hi_x = _mm256_maddubs_epi16(hi, loadu(xq + 64 * g + 32));
    by_pair[g] = _mm256_add_epi32(madd(lo_x, _mm256_set1_epi32(scale_words[2 * g])),
                                  madd(hi_x, _mm256_set1_epi32(scale_words[2 * g + 1])));
  }
  const __m256i scaled = slice_sums(by_pair);
  // In kQuadOrder, positions p and p + 4 are slices 2p and 2p + 1, both with mins (2p, 2p + 1).
  const __m128i min_pairs = _mm_unpackhi_epi8(scales_mins, _mm_setzero_si128());
  const __m256i mins = madd(_mm256_broadcastsi128_si256(min_pairs), x_sums);
  uint32_t d_bits;
  std::memcpy(&d_bits, block, 4);
  alignas(16) float d_dmin[4];
  _mm_store_ps(d_dmin, _mm_cvtph_ps(_mm_cvtsi32_si128(int(d_bits))));
  const __m256 d = _mm256_broadcast_ss(&d_dmin[0]), dmin = _mm256_broadcast_ss(&d_dmin[1]);
  return _mm256_mul_ps(x_d, _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(scaled)),
                                          _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mins))));
}

template <bool kFifthBit>
struct K45 {
  using X = K45X;
  static constexpr size_t kBlockBytes = kFifthBit ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  static constexpr const SliceOrder& kOrder = kQuadOrder;
  LODE_AVX2_INLINE static __m256 slices(const uint8_t* block, int64_t sb, const X& x) {
    return k45_slices<kFifthBit>(block, x.q + 256 * sb, x.d[sb], x.sums[sb]);
  }
};

// ---- Q6_K -------------------------------------------------------------------------------------

// x for Q6_K rows: per 32 values, maddubs(32, x), the pairs' 32 * (x0 + x1), which turns the
// unsigned 6-bit u * x into (u - 32) * x in int16.
struct Q6KX {
  const int8_t* q;
  const float* d;
  const __m256i* offset;  // [cols / 32]
};

LODE_AVX2 void prepare_q6k_x(const RoundedX& x, int64_t cols, __m256i* offset) {
  for (int64_t i = 0; i < cols / 32; ++i) offset[i] = _mm256_maddubs_epi16(_mm256_set1_epi8(32), loadu(x.q + 32 * i));
}

// Quarter k of a Q6_K half: its 6-bit values from the low (k < 2) or high nibbles of ql and bits
// 2k, 2k + 1 of qh, moved to bits 4-5.
template <int kQuarter>
LODE_AVX2_INLINE __m256i q6k_values(__m256i ql_a, __m256i ql_b, __m256i qh) {
  const __m256i low = kQuarter % 2 ? ql_b : ql_a, low4 = _mm256_set1_epi8(0x0f), bits45 = _mm256_set1_epi8(0x30);
  const __m256i nibbles = _mm256_and_si256(kQuarter < 2 ? low : _mm256_srli_epi16(low, 4), low4);
  __m256i high;
  if constexpr (kQuarter == 0) high = _mm256_slli_epi16(qh, 4);
  if constexpr (kQuarter == 1) high = _mm256_slli_epi16(qh, 2);
  if constexpr (kQuarter == 2) high = qh;
  if constexpr (kQuarter == 3) high = _mm256_srli_epi16(qh, 2);
  return _mm256_or_si256(nibbles, _mm256_and_si256(high, bits45));
}

// Quarter k's two 16-value scales from a half's 8 (int16, in both 128-bit halves of v): word 2k in
// every word of the low half, word 2k + 1 in every word of the high half.
LODE_AVX2_INLINE __m256i q6k_scale_pair(__m256i v, int k) {
  const __m256i pick = _mm256_setr_epi64x(0x0100010001000100ll, 0x0100010001000100ll, 0x0302030203020302ll,
                                          0x0302030203020302ll);
  return _mm256_shuffle_epi8(v, _mm256_add_epi8(pick, _mm256_set1_epi8(char(4 * k))));
}

// (u - 32) * x of one quarter (32 values, x at xq) weighed by its two 16-value scales: 8 int32,
// two per slice.
LODE_AVX2_INLINE __m256i q6k_quarter(__m256i u, const int8_t* xq, __m256i x_offset, __m256i scale) {
  const __m256i centered = _mm256_sub_epi16(_mm256_maddubs_epi16(u, loadu(xq)), x_offset);  // |.| <= 24320
  return madd(centered, scale);
}

// The 8 slices of one Q6_K super-block as slice_q6_k computes them, in kPairOrder. Half h's 128
// values are four quarters of 32 consecutive values; slice 4h + t takes values 8t .. 8t + 7 of
// each quarter, and quarter k's values 16 .. 31 have the next scale, hence two scales a quarter.
LODE_AVX2_INLINE __m256 q6k_slices(const uint8_t* block, const int8_t* xq, const __m256i* x_offset, float x_d) {
  const __m256i all_scales = _mm256_cvtepi8_epi16(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + offsetof(BlockQ6_K, scales))));  // 0-7 | 8-15
  __m256i per_half[2];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m256i ql_a = loadu(block + 64 * h), ql_b = loadu(block + 64 * h + 32);
    const __m256i qh = loadu(block + offsetof(BlockQ6_K, qh) + 32 * h);
    const __m256i scales = h ? _mm256_permute4x64_epi64(all_scales, _MM_SHUFFLE(3, 2, 3, 2))
                             : _mm256_permute4x64_epi64(all_scales, _MM_SHUFFLE(1, 0, 1, 0));  // 8h .. 8h + 7 twice
    const int8_t* x = xq + 128 * h;
    const __m256i* off = x_offset + 4 * h;
    __m256i sum = q6k_quarter(q6k_values<0>(ql_a, ql_b, qh), x, off[0], q6k_scale_pair(scales, 0));
    sum = _mm256_add_epi32(sum, q6k_quarter(q6k_values<1>(ql_a, ql_b, qh), x + 32, off[1], q6k_scale_pair(scales, 1)));
    sum = _mm256_add_epi32(sum, q6k_quarter(q6k_values<2>(ql_a, ql_b, qh), x + 64, off[2], q6k_scale_pair(scales, 2)));
    per_half[h] =
        _mm256_add_epi32(sum, q6k_quarter(q6k_values<3>(ql_a, ql_b, qh), x + 96, off[3], q6k_scale_pair(scales, 3)));
  }
  const __m256i total = pair_sums(per_half[0], per_half[1]);  // int32 2t, 2t + 1 of half h: slice 4h + t
  const __m128 half_d = _mm_cvtph_ps(_mm_cvtsi32_si128(u16_at(block + offsetof(BlockQ6_K, d))));
  alignas(16) float scale[4];
  _mm_store_ss(scale, _mm_mul_ss(half_d, _mm_set_ss(x_d)));
  return _mm256_mul_ps(_mm256_broadcast_ss(scale), _mm256_cvtepi32_ps(total));
}

struct Q6K {
  using X = Q6KX;
  static constexpr size_t kBlockBytes = sizeof(BlockQ6_K);
  static constexpr const SliceOrder& kOrder = kPairOrder;
  LODE_AVX2_INLINE static __m256 slices(const uint8_t* block, int64_t sb, const X& x) {
    return q6k_slices(block, x.q + 256 * sb, x.offset + 8 * sb, x.d[8 * sb]);
  }
};

// ---- The row loop for super-block types ---------------------------------------------------------

// y[r] for each row: super-block sb's 8 slices go to accumulator sb % kAcc (kAcc = lanes / 8).
template <class Kind, int kAcc>
LODE_AVX2 void super_block_rows(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t n_sb,
                                const typename Kind::X& x, float* y) {
  const size_t used_bytes = size_t(n_sb) * Kind::kBlockBytes;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w + size_t(r) * row_bytes;
    prefetch_row_ahead(w, row_bytes, r, rows, used_bytes);
    __m256 acc[kAcc];
    for (__m256& a : acc) a = _mm256_setzero_ps();
    int64_t sb = 0;
    for (; sb + kAcc <= n_sb; sb += kAcc)
#pragma GCC unroll 4
      for (int i = 0; i < kAcc; ++i)
        acc[i] = _mm256_add_ps(acc[i], Kind::slices(row + size_t(sb + i) * Kind::kBlockBytes, sb + i, x));
#pragma GCC unroll 4
    for (int i = 0; i < kAcc - 1; ++i)  // the last n_sb % kAcc super-blocks
      if (sb + i < n_sb)
        acc[i] = _mm256_add_ps(acc[i], Kind::slices(row + size_t(sb + i) * Kind::kBlockBytes, sb + i, x));
    y[r] = butterfly<kAcc>(acc, Kind::kOrder);
  }
}

template <bool kFifthBit, int kAcc>
LODE_AVX2 void k45_rows(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols, const RoundedX& x, float* y) {
  const int64_t n_sb = cols / QK_K;
  Scratch scratch(size_t(n_sb) * 2 * sizeof(__m256));
  __m256* d = scratch.at<__m256>(0);
  __m256i* sums = scratch.at<__m256i>(size_t(n_sb) * sizeof(__m256));
  prepare_k45_x(x, n_sb, d, sums);
  super_block_rows<K45<kFifthBit>, kAcc>(w, row_bytes, rows, n_sb, K45X{x.q, d, sums}, y);
}

template <int kAcc>
LODE_AVX2 void q6k_rows(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols, const RoundedX& x, float* y) {
  Scratch scratch(size_t(cols / 32) * sizeof(__m256i));
  __m256i* offset = scratch.at<__m256i>(0);
  prepare_q6k_x(x, cols, offset);
  super_block_rows<Q6K, kAcc>(w, row_bytes, rows, cols / QK_K, Q6KX{x.q, x.d, offset}, y);
}

// ---- Q8_0, slice form (rows that are not a multiple of 256 values) --------------------------------

// Block quants (32 bytes) times x (32 values): 8 int32, (2k, 2k + 1) the halves of slice k.
LODE_AVX2_INLINE __m256i q8_0_block_parts(const uint8_t* quants, const int8_t* xq) {
  const __m256i q = loadu(quants), xv = loadu(xq);
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(xv, q));  // |.| <= 2 * 128 * 127
  return madd(pairs, _mm256_set1_epi16(1));
}

// Slices 4b .. 4b + 7 (blocks b and b + 1), in kPairOrder: positions 0, 1, 4, 5 block b's, the
// others b + 1's.
LODE_AVX2_INLINE __m256 q8_0_block_pair(const uint8_t* row, int64_t b, const RoundedX& x) {
  const uint8_t* block = row + size_t(b) * sizeof(BlockQ8_0);
  const __m256i sums = pair_sums(q8_0_block_parts(block + 2, x.q + 32 * b),
                                 q8_0_block_parts(block + sizeof(BlockQ8_0) + 2, x.q + 32 * b + 32));
  const int halves = int(u16_at(block)) | int(u16_at(block + sizeof(BlockQ8_0))) << 16;
  const __m128 x_d = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x.d + b)));
  const __m128 scales = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(halves)), x_d);
  const __m256 scale =
      _mm256_permutevar8x32_ps(_mm256_castps128_ps256(scales), _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1));
  return _mm256_mul_ps(scale, _mm256_cvtepi32_ps(sums));
}

// Slices 4b .. 4b + 3 of a row's last, unpaired block, at their positions in kPairOrder (0, 1, 4, 5).
LODE_AVX2_INLINE __m256 q8_0_last_block(const uint8_t* row, int64_t b, const RoundedX& x) {
  const uint8_t* block = row + size_t(b) * sizeof(BlockQ8_0);
  const __m256i parts = q8_0_block_parts(block + 2, x.q + 32 * b);
  const __m128 half_d = _mm_cvtph_ps(_mm_cvtsi32_si128(u16_at(block)));
  const __m256 scale = _mm256_broadcastss_ps(_mm_mul_ss(half_d, _mm_set_ss(x.d[b])));
  return _mm256_mul_ps(scale, _mm256_cvtepi32_ps(pair_sums(parts, parts)));
}

// Block pair p (slices 8p .. 8p + 7) goes to accumulator p % kAcc; an odd last block's 4 slices to
// their positions in the next one, the other 4 left alone.
template <int kAcc>
LODE_AVX2 void q8_0_slice_rows(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols, const RoundedX& x,
                               float* y) {
  const int64_t n_blocks = cols / QK8_0, n_pairs = n_blocks / 2;
  const size_t used_bytes = size_t(n_blocks) * sizeof(BlockQ8_0);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w + size_t(r) * row_bytes;
    prefetch_row_ahead(w, row_bytes, r, rows, used_bytes);
    __m256 acc[kAcc];
    for (__m256& a : acc) a = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + kAcc <= n_pairs; p += kAcc)
#pragma GCC unroll 4
      for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_add_ps(acc[i], q8_0_block_pair(row, 2 * (p + i), x));
#pragma GCC unroll 4
    for (int i = 0; i < kAcc; ++i) {
      if (p + i < n_pairs) {
        acc[i] = _mm256_add_ps(acc[i], q8_0_block_pair(row, 2 * (p + i), x));
      } else if (p + i == n_pairs && n_blocks % 2) {
        const __m256 added = _mm256_add_ps(acc[i], q8_0_last_block(row, n_blocks - 1, x));
        acc[i] = _mm256_blend_ps(acc[i], added, 0x33);
      }
    }
    y[r] = butterfly<kAcc>(acc, kPairOrder);
  }
}

// ---- Q8_0, span form (rows of 256 k values, k <= 64: row_dot_q8_0_spans) ------------------------
//
// A span's 8 block terms d * x.d * (integer sum) in one vector, then added from 0 in block order;
// lane i of lanes_for(spans) adds spans i, i + lanes, ..., and the lanes meet in row_dot's butterfly.

// Each block's half_d * x.d[b], as row_dot_q8_0_spans computes it (n_blocks a multiple of 8).
LODE_AVX2_INLINE void q8_0_block_scales(const uint8_t* row, int64_t n_blocks, const float* x_d, float* out) {
  constexpr size_t kB = sizeof(BlockQ8_0);
  for (int64_t b = 0; b < n_blocks; b += 8) {
    const uint8_t* p = row + size_t(b) * kB;
    const __m128i halves =
        _mm_setr_epi16(short(u16_at(p)), short(u16_at(p + kB)), short(u16_at(p + 2 * kB)), short(u16_at(p + 3 * kB)),
                       short(u16_at(p + 4 * kB)), short(u16_at(p + 5 * kB)), short(u16_at(p + 6 * kB)),
                       short(u16_at(p + 7 * kB)));
    _mm256_storeu_ps(out + b, _mm256_mul_ps(_mm256_cvtph_ps(halves), _mm256_loadu_ps(x_d + b)));
  }
}

// The integer sums of blocks b .. b + 7, in block order.
LODE_AVX2_INLINE __m256i q8_0_span_sums(const uint8_t* row, int64_t b, const int8_t* xq) {
  __m256i s[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j)
    s[j] = q8_0_block_parts(row + size_t(b + j) * sizeof(BlockQ8_0) + 2, xq + 32 * (b + j));
  const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
  const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
  // Each 128-bit half holds blocks' half sums: low halves of blocks 0-3 | their high halves.
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20), _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

LODE_AVX2 void q8_0_span_rows(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols, const RoundedX& x,
                              float* y) {
  const int64_t n_blocks = cols / QK8_0, spans = n_blocks / 8, bytes = n_blocks * int64_t(sizeof(BlockQ8_0));
  const int lanes = lanes_for(spans);
  Scratch scratch(size_t(n_blocks) * sizeof(float));
  float* block_scales = scratch.at<float>(0);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w + size_t(r) * row_bytes;
    prefetch_row_ahead(w, row_bytes, r, rows, size_t(bytes));
    q8_0_block_scales(row, n_blocks, x.d, block_scales);
    float lane_sum[32] = {};
    for (int64_t s = 0; s < spans; ++s) {
      alignas(32) float terms[8];
      _mm256_store_ps(terms, _mm256_mul_ps(_mm256_loadu_ps(block_scales + 8 * s),
                                           _mm256_cvtepi32_ps(q8_0_span_sums(row, 8 * s, x.q))));
      float span_sum = 0.0f;
      for (const float t : terms) span_sum += t;
      lane_sum[s % lanes] += span_sum;
    }
    for (int o = lanes / 2; o > 0; o /= 2)
      for (int i = 0; i < o; ++i) lane_sum[i] += lane_sum[i + o];
    y[r] = lane_sum[0];
  }
}

// ---- Choosing a kernel -------------------------------------------------------------------------

// The kernel of kAcc = lanes / 8 accumulators for `slices` slices (null when lanes < 8).
template <template <int> class Rows>
RowsKernel by_lanes(int64_t slices) {
  switch (lanes_for(slices)) {
    case 8: return Rows<1>::run;
    case 16: return Rows<2>::run;
    case 32: return Rows<4>::run;
    default: return nullptr;
  }
}

template <int kAcc>
struct Q4KRows {
  static constexpr RowsKernel run = k45_rows<false, kAcc>;
};
template <int kAcc>
struct Q5KRows {
  static constexpr RowsKernel run = k45_rows<true, kAcc>;
};
template <int kAcc>
struct Q6KRows {
  static constexpr RowsKernel run = q6k_rows<kAcc>;
};
template <int kAcc>
struct Q8_0SliceRows {
  static constexpr RowsKernel run = q8_0_slice_rows<kAcc>;
};

}  // namespace

RowsKernel kernel_for(GgmlType type, int64_t cols) {
  if (!host_has_avx2() || cols <= 0) return nullptr;
  switch (type) {
    case GgmlType::Q4_K: return cols % QK_K == 0 ? by_lanes<Q4KRows>(cols / 32) : nullptr;
    case GgmlType::Q5_K: return cols % QK_K == 0 ? by_lanes<Q5KRows>(cols / 32) : nullptr;
    case GgmlType::Q6_K: return cols % QK_K == 0 ? by_lanes<Q6KRows>(cols / 32) : nullptr;
    case GgmlType::Q8_0:
      if (q8_0_in_spans(cols)) return q8_0_span_rows;
      return cols % QK8_0 == 0 ? by_lanes<Q8_0SliceRows>(cols / 8) : nullptr;
    default: return nullptr;
  }
}

}  // namespace lode::cpu::q8twin::fast
