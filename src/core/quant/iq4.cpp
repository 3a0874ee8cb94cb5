// Lookup-table 4-bit formats: every 4-bit code indexes a 16-entry table of small integers that a
// block scale multiplies. IQ4_NL (32 values, fp16 scale) and IQ4_XS (256 values, fp16 scale times
// a 6-bit multiplier per 32) share ggml's non-linear table; MXFP4 (32 values) uses the FP4 E2M1
// values, doubled to integers, under a power-of-two E8M0 exponent.
//
// The quantizers are lode's own search (see "Choosing a block scale" below); they minimise the
// plain squared error of the round trip.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/dequant.h"

namespace lode::quant {
namespace {

// Format constants. Code c of a byte's low nibble is value j of its 32-value group, the high
// nibble is value j + 16.
constexpr std::array<int8_t, 16> kIq4Values = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};
constexpr std::array<int8_t, 16> kMxfp4Values = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
constexpr int kGroup = 32;  // values per IQ4_NL / MXFP4 block and per IQ4_XS sub-block

// E8M0 exponent e means 2^(e-127); ggml folds in the 1/2 that undoes the doubled table and builds
// the float 2^(e-128) from bits (subnormal for e < 2). e = 255 is not NaN here, just 2^127.
float e8m0_half_to_fp32(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23;
  return std::bit_cast<float>(bits);
}

// One group of 32: low nibbles first, then high nibbles, each value table[code] * scale (a single
// float multiply, as ggml does).
void dequantize_group(const uint8_t* qs, const std::array<int8_t, 16>& table, float scale, float* dst) {
  for (int j = 0; j < kGroup / 2; ++j) {
    dst[j] = scale * float(table[qs[j] & 0xf]);
    dst[j + kGroup / 2] = scale * float(table[qs[j] >> 4]);
  }
}

int iq4_xs_multiplier(const BlockIQ4_XS& b, int ib) {
  const int low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
  const int high = (b.scales_h >> (2 * ib)) & 3;
  return (low | high << 4) - 32;
}

}  // namespace

void dequantize_row_iq4_nl(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ4_NL*>(src);
  for (int64_t i = 0; i < n / QK4_NL; ++i)
    dequantize_group(blocks[i].qs, kIq4Values, fp16_to_fp32(blocks[i].d), dst + i * QK4_NL);
}

void dequantize_row_iq4_xs(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockIQ4_XS*>(src);
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const float d = fp16_to_fp32(blocks[i].d);
    for (int ib = 0; ib < QK_K / kGroup; ++ib) {
      // ggml rounds d * multiplier to float first, then multiplies by the table value.
      const float scale = d * float(iq4_xs_multiplier(blocks[i], ib));
      dequantize_group(blocks[i].qs + ib * kGroup / 2, kIq4Values, scale, dst + i * QK_K + ib * kGroup);
    }
  }
}

void dequantize_row_mxfp4(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockMXFP4*>(src);
  for (int64_t i = 0; i < n / QK_MXFP4; ++i)
    dequantize_group(blocks[i].qs, kMxfp4Values, e8m0_half_to_fp32(blocks[i].e), dst + i * QK_MXFP4);
}

// ---------------------------------------------------------------------------------------------
// Choosing a block scale
//
// For a group x[32] the error of scale s (codes then chosen as the nearest table entries) is
// E(s) = sum_j min_c (x_j - s*T[c])^2. For a fixed assignment of codes the best s is the least-
// squares one, sum(x*T)/sum(T*T), and the error is sum(x*x) - sum(x*T)^2/sum(T*T). The nearest
// assignment only changes where some x_j/s crosses a midpoint between two table values, so we
// sweep the inverse scale u = 1/s over a window, visit every assignment in order of u, and keep
// the one with the best least-squares error: within the window this is the exact optimum, not a
// grid guess. The table is asymmetric (-127..113), so both signs of s are swept.
//
// IQ4_XS then has to express each sub-block scale as d * m with one fp16 d and integers
// m in [-32, 31]. A quadratic model of each sub-block's error around its two best scales picks
// a few promising d from a dense grid; those are checked exactly (codes re-chosen for the rounded
// scales), refitted by least squares and finally rounded to fp16 (with its neighbours tried).
//
// All searching happens on values divided by a power of two (exact), so huge and tiny inputs
// neither overflow nor lose precision; only the final fp16 scale is in the caller's units.
// ---------------------------------------------------------------------------------------------
namespace {

// Nearest table entry of t = x/s. Every midpoint between neighbouring table values is a multiple
// of 1/2, so the cells [k/2, (k+1)/2) never straddle one: floor(2t) indexes the answer exactly.
struct NearestCodeTable {
  std::array<uint8_t, 512> code{};  // index floor(2t) + 256, t clamped to [-128, 128)
  constexpr NearestCodeTable() {
    for (int cell = 0; cell < 512; ++cell) {
      const double t = (cell - 256) / 2.0 + 0.25;  // any point inside the cell
      int best = 0;
      for (int c = 1; c < 16; ++c)
        if (std::abs(t - kIq4Values[c]) < std::abs(t - kIq4Values[best])) best = c;
      code[cell] = uint8_t(best);
    }
  }
};
constexpr NearestCodeTable kNearest;

inline int nearest_code(float t) {
  float cell = 2.0f * t + 256.0f;
  cell = cell > 0.0f ? cell : 0.0f;  // also maps NaN (0 * inf) to a valid cell
  cell = cell < 511.0f ? cell : 511.0f;
  return kNearest.code[int(cell)];
}

constexpr float table_value(int code) { return float(kIq4Values[code]); }

struct Group {
  float x[kGroup];  // normalised values
  float sumxx = 0;
};

// The codes nearest to x/scale, and the squared error they leave. scale 0 means all zeros.
float assign_codes(const Group& g, float scale, uint8_t* codes) {
  if (scale == 0.0f) {
    std::fill(codes, codes + kGroup, uint8_t(8));  // any code: 0 * T is 0
    return g.sumxx;
  }
  const float inverse = 1.0f / scale;
  float error = 0;
  for (int j = 0; j < kGroup; ++j) {
    const int c = nearest_code(g.x[j] * inverse);
    codes[j] = uint8_t(c);
    const float diff = g.x[j] - scale * table_value(c);
    error += diff * diff;
  }
  return error;
}

// The best least-squares fit with a positive scale: s, its error, and sum(T*T) of its codes
// (the curvature of the error in s while the codes stay put).
struct ScaleFit {
  float scale = 0;
  float error = 0;
  float curvature = 0;
};

// Scales tried, relative to the smallest scale that reaches every value without clipping.
constexpr float kWindowLow = 0.85f, kWindowHigh = 1.3f;
// Inverse scales visited in the window.
constexpr int kBuckets = 32;

// Midpoints between neighbouring table values: kMidpoint[c] separates codes c and c + 1.
// (kMidpoint[15] only pads the lookup of a step from code 15 to itself.)
constexpr std::array<float, 16> kMidpoint = [] {
  std::array<float, 16> m{};
  for (int c = 0; c < 15; ++c) m[c] = 0.5f * (float(kIq4Values[c]) + float(kIq4Values[c + 1]));
  m[15] = 127.5f;
  return m;
}();

ScaleFit best_positive_scale(const float* x, float sumxx) {
  float pos = 0, neg = 0;
  for (int j = 0; j < kGroup; ++j) {
    pos = std::max(pos, x[j]);
    neg = std::max(neg, -x[j]);
  }
  const float unclipped = std::max(pos / table_value(15), neg / -table_value(0));
  ScaleFit best{0, sumxx, 0};
  if (unclipped == 0.0f) return best;
  const float u_low = 1.0f / (kWindowHigh * unclipped), u_high = 1.0f / (kWindowLow * unclipped);

  // Codes at the smallest inverse scale; then, as u grows, x_j * u moves away from zero and
  // code j steps outward at each midpoint it crosses. Each step's change to sum(x*T) and
  // sum(T*T) is filed under the bucket of u where it happens. Neighbouring midpoints are at least
  // 1.64x apart on either side of 0 and the window spans less than that, so a value steps at most
  // twice: both steps are always filed, a step that does not happen changes nothing.
  float sumxt = 0, sumtt = 0;
  float bucket_xt[kBuckets] = {}, bucket_tt[kBuckets] = {};
  const float buckets_per_u = float(kBuckets) / (u_high - u_low), first_bucket = u_low * buckets_per_u;
  auto file_step = [&](float xj, float buckets_per_midpoint, int from, int to) {
    // Clamped without branches (half the steps do not happen and land anywhere): for finite b,
    // (|b| - |b - K| + K) / 2 is b clamped to [0, K] up to rounding, which the integer clamp
    // absorbs. A huge b may land on a wrong bucket, but only a step that does not happen has one.
    const float b = kMidpoint[std::min(from, to)] * buckets_per_midpoint - first_bucket;
    constexpr float K = float(kBuckets - 1);
    const int bucket = std::clamp(int(0.5f * (std::abs(b) - std::abs(b - K) + K)), 0, kBuckets - 1);
    const float before = table_value(from), after = table_value(to);
    bucket_xt[bucket] += xj * (after - before);
    bucket_tt[bucket] += after * after - before * before;
  };
  for (int j = 0; j < kGroup; ++j) {
    const int first = nearest_code(x[j] * u_low), last = nearest_code(x[j] * u_high);
    const int middle = first + std::clamp(last - first, -1, 1);
    sumxt += x[j] * table_value(first);
    sumtt += table_value(first) * table_value(first);
    // a zero value never steps; keep its (ignored) bucket finite
    const float buckets_per_midpoint = x[j] != 0.0f ? buckets_per_u / x[j] : 0.0f;
    file_step(x[j], buckets_per_midpoint, first, middle);
    file_step(x[j], buckets_per_midpoint, middle, last);
  }

  // The codes after each bucket are the nearest codes for the u that ends it: keep the best
  // least-squares error among them.
  // (The running best is a score, not the pair of sums, to keep the loop's dependency short.)
  float best_score = sumxt > 0 ? sumxt * sumxt / sumtt : 0.0f, best_xt = sumxt, best_tt = sumtt;
  for (int b = 0; b < kBuckets; ++b) {
    sumxt += bucket_xt[b];
    sumtt += bucket_tt[b];
    // a negative sum(x*T) would need a negative scale; sum(T*T) >= 32 as the table has no 0
    const float score = sumxt > 0 ? sumxt * sumxt / sumtt : 0.0f;
    const bool better = score > best_score;
    best_score = better ? score : best_score;
    best_xt = better ? sumxt : best_xt;
    best_tt = better ? sumtt : best_tt;
  }
  if (best_score > 0) best = {best_xt / best_tt, std::max(sumxx - best_score, 0.0f), best_tt};
  return best;
}

// Best fits of x with a positive and with a negative scale (the latter fits -x, sign flipped).
struct SignedFits {
  ScaleFit positive, negative;
};

SignedFits best_signed_scales(const Group& g) {
  float negated[kGroup];
  for (int j = 0; j < kGroup; ++j) negated[j] = -g.x[j];
  SignedFits fits{best_positive_scale(g.x, g.sumxx), best_positive_scale(negated, g.sumxx)};
  fits.negative.scale = -fits.negative.scale;
  return fits;
}

// Least-squares scale of fixed codes (0 when the codes carry no signal).
float refit_scale(const Group& g, const uint8_t* codes) {
  float sumxt = 0, sumtt = 0;
  for (int j = 0; j < kGroup; ++j) {
    sumxt += g.x[j] * table_value(codes[j]);
    sumtt += table_value(codes[j]) * table_value(codes[j]);
  }
  return sumtt > 0 ? sumxt / sumtt : 0.0f;
}

// Divides x by a power of two so the largest magnitude lands in [0.5, 1); returns the exponent,
// or nothing (all zeros). Throws on a value that is not finite: no block can represent it.
std::optional<int> normalise(const float* src, int64_t count, float* out, const char* type) {
  float amax = 0;
  for (int64_t j = 0; j < count; ++j) {
    if (!std::isfinite(src[j]))
      fail("{}: cannot quantize the non-finite value {} (index {} of its block); fix or drop the "
           "tensor before quantizing", type, src[j], j);
    amax = std::max(amax, std::abs(src[j]));
  }
  if (amax == 0.0f) return std::nullopt;
  int exponent = 0;
  std::frexp(amax, &exponent);
  if (exponent > -126 && exponent < 126) {  // 2^-exponent is a normal float: multiplying is exact
    const float factor = std::ldexp(1.0f, -exponent);
    for (int64_t j = 0; j < count; ++j) out[j] = src[j] * factor;
  } else {
    for (int64_t j = 0; j < count; ++j) out[j] = std::ldexp(src[j], -exponent);
  }
  return exponent;
}

// fp16 scale candidates for a wanted scale (caller's units): its rounding, plus both neighbours
// where halves are subnormal and so coarse that rounding the scale alone can be far from best.
// An unrepresentably large scale is clamped to the largest half.
int fp16_candidates(float wanted, uint16_t out[3]) {
  const float clamped = std::clamp(wanted, -65504.0f, 65504.0f);
  const uint16_t rounded = fp32_to_fp16(clamped), sign = rounded & 0x8000, magnitude = rounded & 0x7fff;
  int n = 0;
  out[n++] = rounded;
  if (magnitude < 0x0400) {
    out[n++] = sign | uint16_t(magnitude + 1);
    if (magnitude > 0) out[n++] = sign | uint16_t(magnitude - 1);
  }
  return n;
}

void pack_codes(const uint8_t* codes, uint8_t* qs) {
  for (int j = 0; j < kGroup / 2; ++j) qs[j] = uint8_t(codes[j] | codes[j + kGroup / 2] << 4);
}

// The best fp16 scale among the candidates around `scale` (normalised units, exponent from
// normalise()); codes re-chosen for each. Returns the half's bits and fills codes.
uint16_t round_iq4_nl_scale(const Group& g, float scale, int exponent, uint8_t* codes) {
  uint16_t candidates[3];
  const int n = fp16_candidates(std::ldexp(scale, exponent), candidates);
  uint16_t best = candidates[0];
  float best_error = INFINITY;
  for (int c = 0; c < n; ++c) {
    uint8_t trial[kGroup];
    const float error = assign_codes(g, std::ldexp(fp16_to_fp32(candidates[c]), -exponent), trial);
    if (error < best_error) {
      best_error = error;
      best = candidates[c];
      std::copy(trial, trial + kGroup, codes);
    }
  }
  return best;
}

void quantize_iq4_nl_block(const float* src, BlockIQ4_NL& block) {
  Group g;
  uint8_t codes[kGroup];
  const std::optional<int> exponent = normalise(src, kGroup, g.x, "iq4_nl");
  if (!exponent) {
    block.d = 0;
    assign_codes(g, 0.0f, codes);
    pack_codes(codes, block.qs);
    return;
  }
  for (float v : g.x) g.sumxx += v * v;
  const SignedFits fits = best_signed_scales(g);
  float scale = fits.positive.error <= fits.negative.error ? fits.positive.scale : fits.negative.scale;
  // Codes chosen afresh for the least-squares scale can only do better than the sweep's; one
  // more refit of those codes moves the scale toward an optimum the window may have missed.
  uint8_t trial[kGroup];
  const float error = assign_codes(g, scale, codes);
  const float refit = refit_scale(g, codes);
  if (assign_codes(g, refit, trial) < error) scale = refit;
  block.d = round_iq4_nl_scale(g, scale, *exponent, codes);
  pack_codes(codes, block.qs);
}

// IQ4_XS: eight sub-blocks of 32, each scale d * m with one fp16 d and m in [-32, 31].
constexpr int kSubBlocks = QK_K / kGroup;
constexpr int kMinMultiplier = -32, kMaxMultiplier = 31;

struct SubBlock {
  Group group;
  SignedFits fits;
};

// The sub-block's error at scale s as its fit's quadratic (the codes of the fit kept; choosing
// them afresh can only do better, so this is an upper bound that is tight near the fit).
float modelled_error(const SubBlock& b, float s) {
  const ScaleFit& fit = s > 0 ? b.fits.positive : b.fits.negative;
  if (s == 0.0f || fit.scale == 0.0f) return b.group.sumxx;
  const float off = s - fit.scale;
  return fit.error + fit.curvature * off * off;
}

// Multipliers worth trying for a sub-block under super-block scale d: 0 and the two integers
// either side of each of its best scales over d. Returns how many (at most 5, no repeats).
int multiplier_candidates(const SubBlock& b, float d, int out[5]) {
  int n = 0;
  auto add = [&](int m) {
    m = std::clamp(m, kMinMultiplier, kMaxMultiplier);
    if (std::find(out, out + n, m) == out + n) out[n++] = m;
  };
  add(0);
  for (const ScaleFit* fit : {&b.fits.positive, &b.fits.negative}) {
    if (fit->scale == 0.0f) continue;
    // floor of the ratio, kept in int range (the clamp above bounds the result anyway)
    const float ratio = std::clamp(fit->scale / d, -40.0f, 40.0f);
    const int below = int(ratio + 40.0f) - 40;
    add(below);
    add(below + 1);
  }
  return n;
}

// The modelled error of the better of the two multipliers either side of fit.scale / d. (The
// fit's quadratic is right at a zero scale too: it equals sum(x*x) there.)
float modelled_error_near(const ScaleFit& fit, float d) {
  const float ratio = std::clamp(fit.scale / d, float(kMinMultiplier), float(kMaxMultiplier));
  const float below = float(int(ratio - float(kMinMultiplier)) + kMinMultiplier);  // floor
  const float above = std::min(below + 1.0f, float(kMaxMultiplier));
  const float off_below = d * below - fit.scale, off_above = d * above - fit.scale;
  return fit.error + fit.curvature * std::min(off_below * off_below, off_above * off_above);
}

float modelled_total_error(const SubBlock* subs, float d) {
  float total = 0;
  for (int ib = 0; ib < kSubBlocks; ++ib)
    total += std::min({subs[ib].group.sumxx, modelled_error_near(subs[ib].fits.positive, d),
                       modelled_error_near(subs[ib].fits.negative, d)});
  return total;
}

// A complete IQ4_XS choice for one super-block scale d (normalised units).
struct XsChoice {
  float d = 0;
  float error = INFINITY;
  int multiplier[kSubBlocks] = {};
  uint8_t codes[kSubBlocks][kGroup] = {};
};

// Each sub-block takes its best multiplier for d: of the candidates, the two the model ranks
// best are tried with codes chosen afresh.
XsChoice choose_multipliers(const SubBlock* subs, float d) {
  XsChoice choice;
  choice.d = d;
  choice.error = 0;
  for (int ib = 0; ib < kSubBlocks; ++ib) {
    int m[5] = {0};
    const int n = d == 0.0f ? 1 : multiplier_candidates(subs[ib], d, m);
    float modelled[5];
    for (int c = 0; c < n; ++c) modelled[c] = modelled_error(subs[ib], d * float(m[c]));
    for (int i = 0; i < std::min(n, 2); ++i)  // the best two to the front
      for (int c = i + 1; c < n; ++c)
        if (modelled[c] < modelled[i]) {
          std::swap(modelled[c], modelled[i]);
          std::swap(m[c], m[i]);
        }
    float best = INFINITY;
    for (int c = 0; c < std::min(n, 2); ++c) {
      uint8_t trial[kGroup];
      const float error = assign_codes(subs[ib].group, d * float(m[c]), trial);
      if (error < best) {
        best = error;
        choice.multiplier[ib] = m[c];
        std::copy(trial, trial + kGroup, choice.codes[ib]);
      }
    }
    choice.error += best;
  }
  return choice;
}

// Least-squares d for the choice's multipliers and codes (its own d when they carry no signal).
float refit_super_scale(const SubBlock* subs, const XsChoice& choice) {
  float numerator = 0, denominator = 0;
  for (int ib = 0; ib < kSubBlocks; ++ib) {
    float sumxt = 0, sumtt = 0;
    for (int j = 0; j < kGroup; ++j) {
      const float t = table_value(choice.codes[ib][j]);
      sumxt += subs[ib].group.x[j] * t;
      sumtt += t * t;
    }
    const float m = float(choice.multiplier[ib]);
    numerator += m * sumxt;
    denominator += m * m * sumtt;
  }
  return denominator > 0 ? numerator / denominator : choice.d;
}

// Super-block scales to model: the largest sub-block scale over k, for k on a fine grid up to
// the multipliers' reach, with either sign of d (the multiplier range is lopsided).
constexpr float kGridLowest = 20.0f, kGridHighest = 32.0f, kGridStep = 0.25f;
constexpr int kShortlist = 2;  // best modelled scales checked exactly

XsChoice best_xs_choice(const SubBlock* subs) {
  float largest = 0;
  for (int ib = 0; ib < kSubBlocks; ++ib) {
    const SignedFits& f = subs[ib].fits;
    largest = std::max(largest, f.positive.error <= f.negative.error ? f.positive.scale : -f.negative.scale);
  }
  if (largest == 0.0f) return choose_multipliers(subs, 0.0f);

  float shortlist_d[kShortlist] = {}, shortlist_error[kShortlist];
  std::fill(shortlist_error, shortlist_error + kShortlist, INFINITY);
  for (float k = kGridLowest; k <= kGridHighest; k += kGridStep) {
    for (float sign : {1.0f, -1.0f}) {
      const float d = sign * largest / k, error = modelled_total_error(subs, d);
      // insert into the sorted shortlist
      for (int i = 0; i < kShortlist; ++i) {
        if (error < shortlist_error[i]) {
          for (int k2 = kShortlist - 1; k2 > i; --k2) {
            shortlist_error[k2] = shortlist_error[k2 - 1];
            shortlist_d[k2] = shortlist_d[k2 - 1];
          }
          shortlist_error[i] = error;
          shortlist_d[i] = d;
          break;
        }
      }
    }
  }

  XsChoice best;
  for (int i = 0; i < kShortlist && shortlist_error[i] < INFINITY; ++i) {
    XsChoice choice = choose_multipliers(subs, shortlist_d[i]);
    XsChoice refitted = choose_multipliers(subs, refit_super_scale(subs, choice));
    if (refitted.error < choice.error) choice = refitted;
    if (choice.error < best.error) best = choice;
  }
  return best;
}

void write_iq4_xs_block(const XsChoice& choice, uint16_t d_bits, BlockIQ4_XS& block) {
  block.d = d_bits;
  block.scales_h = 0;
  std::fill(block.scales_l, block.scales_l + QK_K / 64, uint8_t(0));
  for (int ib = 0; ib < kSubBlocks; ++ib) {
    const int stored = choice.multiplier[ib] - kMinMultiplier;  // 0..63
    block.scales_l[ib / 2] |= uint8_t((stored & 0xf) << (4 * (ib % 2)));
    block.scales_h |= uint16_t((stored >> 4) << (2 * ib));
    pack_codes(choice.codes[ib], block.qs + ib * kGroup / 2);
  }
}

void quantize_iq4_xs_block(const float* src, BlockIQ4_XS& block) {
  float normalised[QK_K];
  const std::optional<int> exponent = normalise(src, QK_K, normalised, "iq4_xs");
  SubBlock subs[kSubBlocks];
  for (int ib = 0; ib < kSubBlocks; ++ib) {
    Group& g = subs[ib].group;
    std::copy(normalised + ib * kGroup, normalised + (ib + 1) * kGroup, g.x);
    g.sumxx = 0;
    for (float v : g.x) g.sumxx += v * v;
  }
  if (!exponent) {
    write_iq4_xs_block(choose_multipliers(subs, 0.0f), 0, block);
    return;
  }
  for (auto& sub : subs) sub.fits = best_signed_scales(sub.group);
  const XsChoice wanted = best_xs_choice(subs);

  // Round d to fp16 and let every sub-block choose its multiplier and codes again for it.
  uint16_t candidates[3];
  const int n = fp16_candidates(std::ldexp(wanted.d, *exponent), candidates);
  XsChoice best;
  uint16_t best_bits = candidates[0];
  for (int c = 0; c < n; ++c) {
    XsChoice choice = choose_multipliers(subs, std::ldexp(fp16_to_fp32(candidates[c]), -*exponent));
    if (choice.error < best.error) {
      best = choice;
      best_bits = candidates[c];
    }
  }
  write_iq4_xs_block(best, best_bits, block);
}

}  // namespace

void quantize_row_iq4_nl(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t i = 0; i < n / QK4_NL; ++i) quantize_iq4_nl_block(src + i * QK4_NL, blocks[i]);
}

void quantize_row_iq4_xs(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t i = 0; i < n / QK_K; ++i) quantize_iq4_xs_block(src + i * QK_K, blocks[i]);
}

}  // namespace lode::quant
