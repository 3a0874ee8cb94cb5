// Quantizers of Q4_K, Q5_K and Q6_K: lode's own search for a small round-trip error (plain,
// unweighted squared error; ggml's reference quantizers weight their search instead). Per
// 256-value super-block:
//   1. Every sub-block gets a good float grid. Q4_K/Q5_K (value = scale * q - offset): candidate
//      grids of several step sizes and placements, each refit once by least squares, the best
//      few polished. Q6_K (value = scale * q): one least-squares fit per end of its lopsided
//      code range.
//   2. The fp16 super-block scale(s) follow from the largest sub-block grid, and each sub-block
//      then measures a range of integer scale (and min) codes around its float grid and keeps
//      the one that reproduces its values best, codes re-chosen for each candidate.
//   3. (Q4_K/Q5_K) d and dmin are refit by least squares against the chosen integer codes and
//      step 2 is repeated; the better result is kept.
// Every error is measured on exactly the grid the dequantizer will use (fp16 scales as stored).
// Q4_K/Q5_K blocks with a sub-block entirely above zero are also searched mirrored (negative d
// and dmin), which lets the grid start above zero.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/dequant.h"
#include "core/quant/kquants_lanes.h"
#include "core/quant/kquants_scales.h"

namespace lode::quant {
namespace {

// Inputs are clamped to this magnitude: far beyond anything the formats can represent (fp16
// scale 65504 times the largest codes), yet small enough that sums of squares stay finite.
constexpr float kInputLimit = 1e9f;

// Search effort (each step measured against ggml's reference quantizers; more is slower and only
// slightly better). Stage 1 step sizes: range / (max code + steps), steps from first to last.
constexpr float kFirstStep = -1.0f, kLastStep = 3.0f, kStepIncrement = 0.5f, kFineStepIncrement = 0.125f;
// A sub-block is "stretched" (gets the fine steps) when its range exceeds this many times its
// mean magnitude: a few far values, the bulk on a handful of grid points.
constexpr float kStretchedRange = 8.0f;
constexpr int kPolished = 2;        // stage 1 candidates polished (one more refit) and measured
constexpr int kScaleReach = 2;      // Q4_K/Q5_K stage 2: scale codes centre - 2 .. centre + 3
constexpr int kRefitRounds = 1;     // Q4_K/Q5_K stage 3 rounds
constexpr int kSymmetricReach = 8;  // Q6_K stage 2: scale codes centre - 8 .. centre + 9, per end

// The value a float becomes when stored as an fp16 scale (saturating instead of overflowing).
float as_stored_fp16(float v) {
  return fp16_to_fp32(fp32_to_fp16(std::clamp(v, -65504.0f, 65504.0f)));
}

// Copies a super-block, rejecting NaN/inf and clamping absurd magnitudes.
void load_super_block(const float* src, float* x, const char* type_name, int64_t first_index) {
  bool finite = true;
  for (int i = 0; i < QK_K; ++i) {
    finite &= std::fabs(src[i]) <= 3.4028235e38f;  // false for NaN and inf
    x[i] = std::clamp(src[i], -kInputLimit, kInputLimit);
  }
  if (finite) return;
  for (int i = 0; i < QK_K; ++i)
    if (!std::isfinite(src[i]))
      fail("quantize {}: input value {} is {} (only finite floats can be quantized; check the source "
           "tensor)", type_name, first_index + i, src[i]);
}

// ---------------------------------------------------------------------------------------------
// Affine grids (Q4_K, Q5_K): value = scale * q - offset, q in [0, max_code], scale, offset >= 0.

struct AffineGrid {
  float scale = 0, offset = 0;
};

// Nearest codes of a group of values on a grid (scale 0 puts every value on code 0).
inline lanes::Floats nearest_affine_codes(lanes::Floats v, AffineGrid g, float inv_scale, int max_code) {
  return lanes::round_non_negative(lanes::clamp((v + g.offset) * inv_scale, 0.0f, float(max_code)));
}

inline float inverse_or_zero(float scale) { return scale != 0 ? 1.0f / scale : 0.0f; }

// Squared error of n values, each replaced by its nearest grid point.
template <int n>
float affine_error(const float* x, AffineGrid g, int max_code) {
  const float inv_scale = inverse_or_zero(g.scale);
  lanes::Floats error{};
  for (int i = 0; i < n; i += lanes::kWidth) {
    const lanes::Floats v = lanes::load(x + i);
    const lanes::Floats diff = v - (g.scale * nearest_affine_codes(v, g, inv_scale, max_code) - g.offset);
    error += diff * diff;
  }
  return lanes::sum(error);
}

template <int n>
void affine_codes(const float* x, AffineGrid g, int max_code, float* codes) {
  const float inv_scale = inverse_or_zero(g.scale);
  for (int i = 0; i < n; i += lanes::kWidth) {
    const lanes::Floats q = nearest_affine_codes(lanes::load(x + i), g, inv_scale, max_code);
    std::memcpy(codes + i, &q, sizeof q);
  }
}

// Sums over a sub-block's values and their codes on some grid: all a least-squares refit needs.
struct CodeSums {
  float q = 0, qq = 0, xq = 0;
};
struct ValueSums {
  float x = 0, xx = 0;
};

template <int n>
CodeSums code_sums(const float* x, AffineGrid g, int max_code) {
  const float inv_scale = inverse_or_zero(g.scale);
  lanes::Floats q_sum{}, qq_sum{}, xq_sum{};
  for (int i = 0; i < n; i += lanes::kWidth) {
    const lanes::Floats v = lanes::load(x + i);
    const lanes::Floats q = nearest_affine_codes(v, g, inv_scale, max_code);
    q_sum += q, qq_sum += q * q, xq_sum += v * q;
  }
  return {lanes::sum(q_sum), lanes::sum(qq_sum), lanes::sum(xq_sum)};
}

// The least-squares grid for fixed codes, offset >= 0 and scale > 0 (`g` itself when the codes
// cannot pin one down), and its squared error on those same codes: an upper bound of its error
// once every value moves to its nearest point on the new grid.
template <int n>
AffineGrid least_squares_grid(const CodeSums& c, ValueSums v, AffineGrid g, double* error) {
  const float det = float(n) * c.qq - c.q * c.q;  // exact: small integers
  AffineGrid fit = g;
  if (det > 0) {
    fit.scale = (float(n) * c.xq - c.q * v.x) / det;
    fit.offset = (fit.scale * c.q - v.x) * (1.0f / float(n));
    if (fit.offset < 0) fit = {c.xq / c.qq, 0.0f};
    if (!(fit.scale > 0)) fit = g;
  }
  const double s = fit.scale, m = fit.offset;
  *error = v.xx - 2 * s * c.xq + 2 * m * v.x + s * s * c.qq - 2 * s * m * c.q + n * m * m;
  return fit;
}

// One polishing step: nearest codes on `g`, then the least-squares grid for those codes.
template <int n>
AffineGrid refit_affine(const float* x, AffineGrid g, int max_code, ValueSums v) {
  double unused;
  return least_squares_grid<n>(code_sums<n>(x, g, max_code), v, g, &unused);
}

// Stage 1's result for one sub-block: its best float grid, and where its values sit on that grid
// on average, which tells stage 2 how the offset must move when the scale moves.
struct SubBlockFit {
  AffineGrid grid;
  float mean_code = 0, mean_x = 0;
};

// Keeps the k best distinct candidates, best first.
template <int k>
struct BestGrids {
  AffineGrid grid[k];
  double error[k];
  BestGrids() { std::fill(error, error + k, INFINITY); }
  void offer(AffineGrid g, double e) {
    for (int i = 0; i < k; ++i) {
      if (grid[i].scale == g.scale && grid[i].offset == g.offset) return;
      if (e < error[i]) {
        std::copy_backward(grid + i, grid + k - 1, grid + k);
        std::copy_backward(error + i, error + k - 1, error + k);
        grid[i] = g, error[i] = e;
        return;
      }
    }
  }
};

// Stage 1: the best float grid of one sub-block. Candidate grids with step sizes around
// "range / steps", each placed three ways (lowest point on the smallest value, highest point on
// the largest value, a point on zero), are each refit once by least squares and ranked by their
// error on the codes they were refit for; the best few are then polished by alternating
// nearest-code assignment with refits, and measured exactly. When a few values stretch the range
// far beyond the bulk, the bulk sits on a handful of grid points and the error swings with every
// small change of step size, so such sub-blocks get a finer sweep.
template <int n>
SubBlockFit fit_affine_sub_block(const float* x, int max_code) {
  float lo = 0, hi = x[0], sum_abs = 0;
  ValueSums sums;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sums.x += x[i], sums.xx += x[i] * x[i], sum_abs += std::fabs(x[i]);
  }
  SubBlockFit fit;
  fit.mean_x = sums.x / float(n);
  if (hi <= lo) return fit.grid = {0.0f, -lo}, fit;

  const bool stretched = hi - lo > kStretchedRange * sum_abs / float(n);
  const float step_increment = stretched ? kFineStepIncrement : kStepIncrement;
  BestGrids<kPolished> candidates;
  for (float steps = kFirstStep; steps <= kLastStep; steps += step_increment) {
    const float scale = (hi - lo) / (float(max_code) + steps);
    const float on_zero = scale * std::nearbyint(-lo / scale);
    for (float offset : {-lo, scale * float(max_code) - hi, on_zero}) {
      const AffineGrid start{scale, std::max(offset, 0.0f)};
      double error;
      const AffineGrid g = least_squares_grid<n>(code_sums<n>(x, start, max_code), sums, start, &error);
      candidates.offer(g, error);
    }
  }
  AffineGrid best = candidates.grid[0];
  float best_error = INFINITY;
  for (int k = 0; k < kPolished && candidates.error[k] < INFINITY; ++k) {
    const AffineGrid g = refit_affine<n>(x, candidates.grid[k], max_code, sums);
    const float error = affine_error<n>(x, g, max_code);
    if (error < best_error) best_error = error, best = g;
  }
  float codes[n], sum_codes = 0;
  affine_codes<n>(x, best, max_code, codes);
  for (float q : codes) sum_codes += q;
  fit.grid = best;
  fit.mean_code = sum_codes / float(n);
  return fit;
}

struct AffineSuperBlock {
  float d = 0, dmin = 0;  // as stored (fp16-rounded)
  uint8_t scales[8] = {}, mins[8] = {};
  float error = 0;
};

AffineGrid sub_block_grid(const AffineSuperBlock& sb, int j) {
  return {sb.d * float(sb.scales[j]), sb.dmin * float(sb.mins[j])};
}

// Stage 2 for one sub-block, d and dmin fixed: the integer scale and min with the least error.
// Scale codes around the float fit are tried; for each, the offset that keeps the sub-block's
// values where they were on the grid (mean code) is rounded both ways to a min code.
float choose_affine_sub_block_codes(const float* x, const SubBlockFit& fit, int max_code, float d,
                                    float dmin, uint8_t& scale_code, uint8_t& min_code) {
  float best = INFINITY;
  const int centre = d > 0 ? int(std::min(fit.grid.scale / d, 63.0f)) : 0;
  for (int ls = std::max(centre - kScaleReach, 0); ls <= std::min(centre + kScaleReach + 1, 63); ++ls) {
    const float scale = d * float(ls);
    const float offset = std::max(scale * fit.mean_code - fit.mean_x, 0.0f);
    const int low = dmin > 0 ? int(std::min(offset / dmin, 63.0f)) : 0;
    for (int lm = low; lm <= std::min(low + 1, 63); ++lm) {
      const float error = affine_error<32>(x, {scale, dmin * float(lm)}, max_code);
      if (error < best) best = error, scale_code = uint8_t(ls), min_code = uint8_t(lm);
    }
    if (d == 0) break;
  }
  return best;
}

void choose_affine_codes(const float* x, const SubBlockFit* fits, int max_code, AffineSuperBlock& sb) {
  sb.error = 0;
  for (int j = 0; j < 8; ++j)
    sb.error += choose_affine_sub_block_codes(x + 32 * j, fits[j], max_code, sb.d, sb.dmin,
                                              sb.scales[j], sb.mins[j]);
}

// Stage 3: least-squares d and dmin for the current integer codes: x ~ d * (scale * q) - dmin * min.
void refit_affine_super_block(const float* x, int max_code, AffineSuperBlock& sb) {
  double aa = 0, ab = 0, bb = 0, xa = 0, xb = 0;
  for (int j = 0; j < 8; ++j) {
    float q[32];
    affine_codes<32>(x + 32 * j, sub_block_grid(sb, j), max_code, q);
    const double b = sb.mins[j];
    for (int i = 0; i < 32; ++i) {
      const double a = double(sb.scales[j]) * q[i];
      aa += a * a, ab += a * b, bb += b * b, xa += x[32 * j + i] * a, xb += x[32 * j + i] * b;
    }
  }
  if (aa <= 0) return;
  const double det = aa * bb - ab * ab;
  double d = (xa + sb.dmin * ab) / aa, dmin = sb.dmin;  // d alone, dmin kept
  if (det > 1e-9 * aa * bb) {
    const double d2 = (xa * bb - ab * xb) / det, dmin2 = (ab * xa - aa * xb) / det;
    if (d2 > 0 && dmin2 >= 0) d = d2, dmin = dmin2;
  }
  sb.d = as_stored_fp16(float(d));
  sb.dmin = as_stored_fp16(float(dmin));
}

// Stages 1-3 for one super-block, with d and dmin >= 0.
AffineSuperBlock search_affine_super_block(const float* x, int max_code) {
  SubBlockFit fits[8];
  float max_scale = 0, max_offset = 0;
  for (int j = 0; j < 8; ++j) {
    fits[j] = fit_affine_sub_block<32>(x + 32 * j, max_code);
    max_scale = std::max(max_scale, fits[j].grid.scale);
    max_offset = std::max(max_offset, fits[j].grid.offset);
  }
  AffineSuperBlock trial;
  trial.d = as_stored_fp16(max_scale / 63);
  trial.dmin = as_stored_fp16(max_offset / 63);
  choose_affine_codes(x, fits, max_code, trial);
  AffineSuperBlock best = trial;
  for (int round = 0; round < kRefitRounds && best.error > 0; ++round) {
    refit_affine_super_block(x, max_code, trial);
    choose_affine_codes(x, fits, max_code, trial);
    if (trial.error < best.error) best = trial;
  }
  return best;
}

// With d, dmin >= 0 the lowest grid point of every sub-block is <= 0, which wastes codes on data
// that sit well above zero. Negating both fp16 scales mirrors the grid exactly (the dequantizer's
// float arithmetic is sign-symmetric), so such blocks are searched as -x and mirrored back.
AffineSuperBlock quantize_affine_super_block(const float* x, int max_code) {
  AffineSuperBlock best = search_affine_super_block(x, max_code);
  bool some_sub_block_positive = false;
  for (int j = 0; j < 8; ++j)
    some_sub_block_positive |= *std::min_element(x + 32 * j, x + 32 * j + 32) > 0;
  if (!some_sub_block_positive) return best;
  float negated[QK_K];
  for (int i = 0; i < QK_K; ++i) negated[i] = -x[i];
  AffineSuperBlock mirrored = search_affine_super_block(negated, max_code);
  if (!(mirrored.error < best.error)) return best;
  mirrored.d = -mirrored.d, mirrored.dmin = -mirrored.dmin;
  return mirrored;
}

// The final codes of a super-block (0..max_code), one per value.
void final_affine_codes(const float* x, const AffineSuperBlock& sb, int max_code, uint8_t* codes) {
  for (int j = 0; j < 8; ++j) {
    float q[32];
    affine_codes<32>(x + 32 * j, sub_block_grid(sb, j), max_code, q);
    for (int i = 0; i < 32; ++i) codes[32 * j + i] = uint8_t(q[i]);
  }
}

// ---------------------------------------------------------------------------------------------
// Symmetric grids (Q6_K): value = scale * q, q in [-32, 31], scale signed.

inline lanes::Floats nearest_q6_codes(lanes::Floats v, float inv_scale) {
  return lanes::round_non_negative(lanes::clamp(v * inv_scale, -32.0f, 31.0f) + 32.0f) - 32.0f;
}

template <int n>
float symmetric_error(const float* x, float scale) {
  const float inv_scale = inverse_or_zero(scale);
  lanes::Floats error{};
  for (int i = 0; i < n; i += lanes::kWidth) {
    const lanes::Floats v = lanes::load(x + i);
    const lanes::Floats diff = v - scale * nearest_q6_codes(v, inv_scale);
    error += diff * diff;
  }
  return lanes::sum(error);
}

template <int n>
void symmetric_codes(const float* x, float scale, float* codes) {
  const float inv_scale = inverse_or_zero(scale);
  for (int i = 0; i < n; i += lanes::kWidth) {
    const lanes::Floats q = nearest_q6_codes(lanes::load(x + i), inv_scale);
    std::memcpy(codes + i, &q, sizeof q);
  }
}

template <int n>
float refit_symmetric(const float* x, float scale) {
  const float inv_scale = inverse_or_zero(scale);
  lanes::Floats sum_qq{}, sum_xq{};
  for (int i = 0; i < n; i += lanes::kWidth) {
    const lanes::Floats v = lanes::load(x + i);
    const lanes::Floats q = nearest_q6_codes(v, inv_scale);
    sum_qq += q * q, sum_xq += v * q;
  }
  const float sqq = lanes::sum(sum_qq), sxq = lanes::sum(sum_xq);
  return sqq > 0 && sxq != 0 ? sxq / sqq : scale;
}

// Stage 1 for one 16-value sub-block. The code range is lopsided (-32..31), so the largest
// magnitude can sit on the wide end (-32) or the narrow end (+31): the best float scale of each
// kind is kept, and stage 2 searches around both.
struct SymmetricFit {
  float wide = 0, narrow = 0;
};

template <int n>
SymmetricFit fit_symmetric_sub_block(const float* x) {
  float peak = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(peak)) peak = x[i];
  if (peak == 0) return {};
  SymmetricFit fit{-peak / 32, peak / 31};
  for (float* scale : {&fit.wide, &fit.narrow})
    for (int pass = 0; pass < 2; ++pass) *scale = refit_symmetric<n>(x, *scale);
  return fit;
}

struct SymmetricSuperBlock {
  float d = 0;  // as stored
  int8_t scales[16] = {};
};

// Stage 2: d fixed, the integer scale of each sub-block. Every code within kSymmetricReach of
// either float fit is measured: with 16 values per sub-block, the error jumps whenever the scale
// moves a value across a rounding boundary, and scales well away from the float optimum often
// land better.
void choose_symmetric_codes(const float* x, const SymmetricFit* fits, SymmetricSuperBlock& sb) {
  for (int j = 0; j < 16; ++j) {
    float best = INFINITY;
    for (float fit : {fits[j].wide, fits[j].narrow}) {
      const float ratio = sb.d != 0 ? fit / sb.d : 0.0f;
      const int centre = int(std::floor(std::clamp(ratio, -128.0f, 127.0f)));
      const int first = std::max(centre - kSymmetricReach, -128);
      const int last = std::min(centre + kSymmetricReach + 1, 127);
      for (int code = first; code <= last; ++code) {
        const float error = symmetric_error<16>(x + 16 * j, sb.d * float(code));
        if (error < best) best = error, sb.scales[j] = int8_t(code);
      }
    }
  }
}

// How well a super-block scale suits the sub-blocks before any search: the error of every
// sub-block at the code nearest to its better float fit.
float quick_symmetric_error(const float* x, const SymmetricFit* fits, float d) {
  float total = 0;
  for (int j = 0; j < 16; ++j) {
    float best = INFINITY;
    for (float fit : {fits[j].wide, fits[j].narrow}) {
      const float code = std::nearbyint(std::clamp(fit / d, -128.0f, 127.0f));
      best = std::min(best, symmetric_error<16>(x + 16 * j, d * code));
    }
    total += best;
  }
  return total;
}

SymmetricSuperBlock quantize_symmetric_super_block(const float* x) {
  SymmetricFit fits[16];
  float peak = 0;
  for (int j = 0; j < 16; ++j) {
    fits[j] = fit_symmetric_sub_block<16>(x + 16 * j);
    if (std::fabs(fits[j].wide) > std::fabs(peak)) peak = fits[j].wide;
  }
  SymmetricSuperBlock sb;
  // The largest wide-end scale gets code -120, leaving stage 2 room above it, or the extreme
  // -128, which keeps exact fits exact (a constant block, say): whichever starts out better.
  const float d_roomy = as_stored_fp16(-peak / 120), d_extreme = as_stored_fp16(-peak / 128);
  if (d_roomy == 0 || d_extreme == 0) return sb;  // all zero, or below fp16's reach
  sb.d = quick_symmetric_error(x, fits, d_extreme) < quick_symmetric_error(x, fits, d_roomy) ? d_extreme : d_roomy;
  choose_symmetric_codes(x, fits, sb);
  return sb;
}

}  // namespace

void quantize_row_q4_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_K*>(dst);
  float x[QK_K];
  uint8_t codes[QK_K];
  for (int64_t b = 0; b < n / QK_K; ++b) {
    load_super_block(src + b * QK_K, x, "q4_K", b * QK_K);
    const AffineSuperBlock sb = quantize_affine_super_block(x, 15);
    final_affine_codes(x, sb, 15, codes);
    BlockQ4_K& block = blocks[b];
    block.d = fp32_to_fp16(sb.d);
    block.dmin = fp32_to_fp16(sb.dmin);
    pack_scales_mins_k4(sb.scales, sb.mins, block.scales);
    for (int group = 0; group < 4; ++group)  // sub-blocks 2g (low nibbles) and 2g+1 (high)
      for (int l = 0; l < 32; ++l)
        block.qs[32 * group + l] = uint8_t(codes[64 * group + l] | (codes[64 * group + 32 + l] << 4));
  }
}

void quantize_row_q5_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ5_K*>(dst);
  float x[QK_K];
  uint8_t codes[QK_K];
  for (int64_t b = 0; b < n / QK_K; ++b) {
    load_super_block(src + b * QK_K, x, "q5_K", b * QK_K);
    const AffineSuperBlock sb = quantize_affine_super_block(x, 31);
    final_affine_codes(x, sb, 31, codes);
    BlockQ5_K& block = blocks[b];
    block.d = fp32_to_fp16(sb.d);
    block.dmin = fp32_to_fp16(sb.dmin);
    pack_scales_mins_k4(sb.scales, sb.mins, block.scales);
    std::memset(block.qh, 0, sizeof block.qh);
    for (int sub = 0; sub < 8; ++sub)
      for (int l = 0; l < 32; ++l) block.qh[l] |= uint8_t((codes[32 * sub + l] >> 4) << sub);
    for (int group = 0; group < 4; ++group)
      for (int l = 0; l < 32; ++l)
        block.qs[32 * group + l] =
            uint8_t((codes[64 * group + l] & 0x0f) | ((codes[64 * group + 32 + l] & 0x0f) << 4));
  }
}

void quantize_row_q6_K(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ6_K*>(dst);
  float x[QK_K];
  for (int64_t b = 0; b < n / QK_K; ++b) {
    load_super_block(src + b * QK_K, x, "q6_K", b * QK_K);
    const SymmetricSuperBlock sb = quantize_symmetric_super_block(x);
    uint8_t codes[QK_K];  // q + 32, 0..63
    for (int j = 0; j < 16; ++j) {
      float q[16];
      symmetric_codes<16>(x + 16 * j, sb.d * float(sb.scales[j]), q);
      for (int i = 0; i < 16; ++i) codes[16 * j + i] = uint8_t(int(q[i]) + 32);
    }
    BlockQ6_K& block = blocks[b];
    block.d = fp32_to_fp16(sb.d);
    std::memcpy(block.scales, sb.scales, sizeof block.scales);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* c = codes + 128 * half;
      for (int l = 0; l < 32; ++l) {
        block.ql[64 * half + l] = uint8_t((c[l] & 0x0f) | ((c[l + 64] & 0x0f) << 4));
        block.ql[64 * half + 32 + l] = uint8_t((c[l + 32] & 0x0f) | ((c[l + 96] & 0x0f) << 4));
        block.qh[32 * half + l] =
            uint8_t((c[l] >> 4) | ((c[l + 32] >> 4) << 2) | ((c[l + 64] >> 4) << 4) | ((c[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace lode::quant
