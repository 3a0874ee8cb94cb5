// IQ4_NL and IQ4_XS quantizers: lode's own search; they minimise the plain squared error of the
// round trip.
//
// A group x[32] with scale s leaves the error E(s) = sum_j min_c (x_j - s*T[c])^2 once every
// code is the table entry nearest x_j/s. For fixed codes the best s is the least-squares one,
// sum(x*T)/sum(T*T), leaving sum(x*x) - sum(x*T)^2/sum(T*T). Codes change only where some x_j/s
// crosses a midpoint between two table entries, so one pass over the value crossings visits
// every inverse scale u = 1/s of a window (in buckets) and keeps the best least-squares fit: a
// dense grid for the price of a few plain evaluations. The table is lopsided (-127..113), so
// positive and negative scales are searched apart.
//
// IQ4_XS must write each sub-block scale as d * m with one fp16 d and an integer m in [-32, 31].
// Each sub-block's two best fits (one per sign) give it a quadratic error model; a fine grid of
// fp16-rounded d is ranked by the summed model, and the best few are checked exactly: every
// sub-block re-chooses its multiplier and codes, d is refitted by least squares and rounded
// again.
//
// The search runs on values divided by a power of two (exact), so huge and tiny inputs neither
// overflow nor lose precision; only the stored fp16 scale is in the caller's units.
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
#include "core/quant/iq4_table.h"

namespace lode::quant {
namespace {

constexpr int kGroup = kIq4Group;

// Nearest table entry of t = x/s. Every midpoint between neighbouring table values is a multiple
// of 1/2, so the cells [k/2, (k+1)/2) never straddle one: floor(2t) indexes the answer exactly.
struct NearestCodeTable {
  std::array<uint8_t, 512> code{};  // index floor(2t) + 256, t clamped to [-128, 128)
  constexpr NearestCodeTable() {
    for (int cell = 0; cell < 512; ++cell) {
      const double t = (cell - 256) / 2.0 + 0.25;  // any point inside the cell
      auto distance = [t](int c) { return t > kIq4Values[c] ? t - kIq4Values[c] : kIq4Values[c] - t; };
      int best = 0;
      for (int c = 1; c < 16; ++c)
        if (distance(c) < distance(best)) best = c;
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

// Midpoints between neighbouring table values: kMidpoint[c] separates codes c and c + 1.
// (kMidpoint[15] only pads the lookup of a step from code 15 to itself.)
constexpr std::array<float, 16> kMidpoint = [] {
  std::array<float, 16> m{};
  for (int c = 0; c < 15; ++c) m[c] = 0.5f * (float(kIq4Values[c]) + float(kIq4Values[c + 1]));
  m[15] = 127.5f;
  return m;
}();

// --- the caller's units ----------------------------------------------------------------------

// Values are searched divided by 2^exponent, which puts the largest magnitude in [0.5, 1).
struct Normalisation {
  int exponent = 0;
  // Exact both ways (a power of two), also where the factor itself is no normal float.
  float to_caller(float v) const { return exact_factors ? v * up : std::ldexp(v, exponent); }
  float from_caller(float v) const { return exact_factors ? v * down : std::ldexp(v, -exponent); }
  // The fp16 nearest a normalised scale (clamped to the largest finite half), and back.
  uint16_t half_bits(float scale) const {
    return fp32_to_fp16(std::clamp(to_caller(scale), -65504.0f, 65504.0f));
  }
  float half_value(uint16_t bits) const { return from_caller(fp16_to_fp32(bits)); }

  bool exact_factors = false;
  float up = 1, down = 1;
};

// Normalises src into out; nothing (and zeros in out) when every value is zero. Magnitudes beyond
// `reach`, the largest any block of the format can hold, are clipped to it first: those values
// saturate whatever the search does, and clipped they keep the search well conditioned (their
// signs are kept rather than lost below float precision). Throws on a value that is not finite:
// no block can represent it.
std::optional<Normalisation> normalise(const float* src, int count, float reach, float* out,
                                       const char* type) {
  float amax = 0;
  for (int j = 0; j < count; ++j) {
    if (!std::isfinite(src[j]))
      fail("{}: cannot quantize the non-finite value {} (index {} of its block); fix or drop the "
           "tensor before quantizing", type, src[j], j);
    out[j] = std::clamp(src[j], -reach, reach);
    amax = std::max(amax, std::abs(out[j]));
  }
  if (amax == 0.0f) return std::nullopt;
  Normalisation n;
  std::frexp(amax, &n.exponent);
  n.exact_factors = n.exponent > -126 && n.exponent < 126;
  if (n.exact_factors) {
    n.up = std::ldexp(1.0f, n.exponent);
    n.down = std::ldexp(1.0f, -n.exponent);
  }
  for (int j = 0; j < count; ++j) out[j] = n.from_caller(out[j]);
  return n;
}

// fp16 scales to try for a wanted normalised scale: its rounding, plus `reach` neighbours either
// side (finite, same sign). Returns how many (at most 1 + 2 * reach).
int half_candidates(const Normalisation& n, float scale, int reach, uint16_t* out) {
  const uint16_t rounded = n.half_bits(scale), sign = rounded & 0x8000, magnitude = rounded & 0x7fff;
  int count = 0;
  out[count++] = rounded;
  for (int step = 1; step <= reach; ++step) {
    if (magnitude + step <= 0x7bff) out[count++] = sign | uint16_t(magnitude + step);
    if (magnitude >= step) out[count++] = sign | uint16_t(magnitude - step);
  }
  return count;
}

// Neighbours of a rounded scale worth trying: where halves are subnormal (coarse), or where the
// rounding costs more than the quantization itself (a constant block, say), the plain rounding
// can be far from the best half.
constexpr int kNeighbours = 2;
bool rounding_dominates(uint16_t bits, float rounded_error, float unrounded_error) {
  return (bits & 0x7fff) < 0x0400 || rounded_error > 1.5f * unrounded_error;
}

// --- one group of 32 -------------------------------------------------------------------------

struct Group {
  float x[kGroup];  // normalised values
  float sumxx = 0;
};

// The codes nearest to x/scale, and the squared error they leave. Scale 0 means all zeros.
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

// Least-squares scale of fixed codes.
float refit_scale(const Group& g, const uint8_t* codes) {
  float sumxt = 0, sumtt = 0;
  for (int j = 0; j < kGroup; ++j) {
    sumxt += g.x[j] * table_value(codes[j]);
    sumtt += table_value(codes[j]) * table_value(codes[j]);
  }
  return sumxt / sumtt;  // sum(T*T) >= 32: the table has no 0
}

// A least-squares fit: its scale, its error, and sum(T*T) of its codes (the curvature of the
// error in the scale while the codes stay put). Scale 0: no fit (all values zero).
struct ScaleFit {
  float scale = 0;
  float error = 0;
  float curvature = 0;
};

// Scales searched, relative to the smallest that reaches every value without clipping (the
// best one lands between 0.85 and 1.3 of it but for a few per mille of groups), and the number of
// inverse scales visited in between.
constexpr float kWindowLow = 0.85f, kWindowHigh = 1.3f;
constexpr int kBuckets = 32;

ScaleFit best_positive_scale(const float* x, float sumxx) {
  float pos = 0, neg = 0;
  for (int j = 0; j < kGroup; ++j) {
    pos = std::max(pos, x[j]);
    neg = std::max(neg, -x[j]);
  }
  const float unclipped = std::max(pos / table_value(15), neg / -table_value(0));
  if (unclipped == 0.0f) return {0, sumxx, 0};
  const float u_low = 1.0f / (kWindowHigh * unclipped), u_high = 1.0f / (kWindowLow * unclipped);

  // Codes at the smallest inverse scale; then, as u grows, x_j * u moves away from zero and code
  // j steps outward at each midpoint it crosses. Each step's change to sum(x*T) and sum(T*T) is
  // filed under the bucket of u where it happens. Neighbouring midpoints on either side of 0 are
  // at least 1.64x apart and the window spans less than that, so a value steps at most twice:
  // both steps are always filed, and a step that does not happen changes nothing.
  static_assert(kWindowHigh / kWindowLow < 1.64f);
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
    // A value this small (the largest is at least 1/2) never steps; keep its ignored buckets
    // finite rather than divide by it.
    const float buckets_per_midpoint = std::abs(x[j]) > 0x1p-40f ? buckets_per_u / x[j] : 0.0f;
    file_step(x[j], buckets_per_midpoint, first, middle);
    file_step(x[j], buckets_per_midpoint, middle, last);
  }

  // The codes after each bucket are the nearest codes for the u that ends it: keep the best
  // least-squares fit among them. (The running best is a score, not the pair of sums, to keep
  // the loop's dependency short.)
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
  if (best_score == 0.0f) return {0, sumxx, 0};
  return {best_xt / best_tt, std::max(sumxx - best_score, 0.0f), best_tt};
}

// The best fits of a group with a positive and with a negative scale (the latter fits -x).
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

void pack_codes(const uint8_t* codes, uint8_t* qs) {
  for (int j = 0; j < kGroup / 2; ++j) qs[j] = uint8_t(codes[j] | codes[j + kGroup / 2] << 4);
}

// --- IQ4_NL ----------------------------------------------------------------------------------

// The best fp16 scale tried so far for a group, with the codes chosen for it.
struct HalfSearch {
  const Group& group;
  const Normalisation& norm;
  uint16_t bits = 0;
  float error = INFINITY;
  uint8_t codes[kGroup] = {};

  void try_half(uint16_t candidate) {
    uint8_t trial[kGroup];
    const float trial_error = assign_codes(group, norm.half_value(candidate), trial);
    if (trial_error < error) {
      error = trial_error;
      bits = candidate;
      std::copy(trial, trial + kGroup, codes);
    }
  }
};

void quantize_iq4_nl_block(const float* src, BlockIQ4_NL& block) {
  Group g;
  constexpr float kReach = 65504.0f * 127;  // largest half times the table's largest magnitude
  const std::optional<Normalisation> norm = normalise(src, kGroup, kReach, g.x, "iq4_nl");
  if (!norm) {
    HalfSearch zero{g, Normalisation{}};
    zero.try_half(0);
    block.d = 0;
    pack_codes(zero.codes, block.qs);
    return;
  }
  for (float v : g.x) g.sumxx += v * v;
  const SignedFits fits = best_signed_scales(g);
  const bool positive_first = fits.positive.error <= fits.negative.error;
  const ScaleFit& first = positive_first ? fits.positive : fits.negative;
  const ScaleFit& second = positive_first ? fits.negative : fits.positive;

  // Codes chosen afresh for the least-squares scale can only do better than the sweep's; one
  // more refit of those codes moves the scale toward an optimum the window may have missed.
  float scale = first.scale;
  uint8_t codes[kGroup], trial[kGroup];
  const float error = assign_codes(g, scale, codes);
  const float refit = refit_scale(g, codes);
  if (assign_codes(g, refit, trial) < error) scale = refit;

  // Round to fp16 and choose the codes for the scale actually stored. Where the two signs fit
  // about equally well, the rounding decides: try both.
  HalfSearch best{g, *norm};
  best.try_half(norm->half_bits(scale));
  if (second.scale != 0.0f && second.error <= 1.02f * first.error)
    best.try_half(norm->half_bits(second.scale));
  if (rounding_dominates(best.bits, best.error, first.error)) {
    // The fit was (nearly) exact for several table entries and the rounding favours none in
    // particular: try the scale that puts the largest value on each entry, and neighbours.
    float extreme = 0;
    for (float v : g.x) extreme = std::abs(v) > std::abs(extreme) ? v : extreme;
    for (int c = 0; c < 16; ++c) best.try_half(norm->half_bits(extreme / table_value(c)));
    uint16_t neighbours[1 + 2 * kNeighbours];
    const int n = half_candidates(*norm, norm->half_value(best.bits), kNeighbours, neighbours);
    for (int c = 1; c < n; ++c) best.try_half(neighbours[c]);
  }
  block.d = best.bits;
  pack_codes(best.codes, block.qs);
}

// --- IQ4_XS ----------------------------------------------------------------------------------

constexpr int kSubBlocks = QK_K / kGroup;
constexpr int kMinMultiplier = -32, kMaxMultiplier = 31;

struct SubBlock {
  Group group;
  SignedFits fits;
};

// The sub-block's error at scale s as its fit's quadratic: the fit's codes kept, so an upper
// bound (codes chosen afresh can only do better) that is tight near the fit.
float modelled_error(const SubBlock& b, float s) {
  const ScaleFit& fit = s > 0 ? b.fits.positive : b.fits.negative;
  if (s == 0.0f || fit.scale == 0.0f) return b.group.sumxx;
  const float off = s - fit.scale;
  return fit.error + fit.curvature * off * off;
}

// The modelled error of the better multiplier either side of fit.scale / d. (The quadratic is
// right at a zero scale too: it equals sum(x*x) there.)
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

// Multipliers worth trying for a sub-block under super-block scale d (nonzero): 0 and the
// integers either side of each of its best scales over d. Returns how many (at most 5, distinct).
int multiplier_candidates(const SubBlock& b, float d, int out[5]) {
  int n = 0;
  auto add = [&](int m) {
    m = std::clamp(m, kMinMultiplier, kMaxMultiplier);
    if (std::find(out, out + n, m) == out + n) out[n++] = m;
  };
  add(0);
  for (const ScaleFit* fit : {&b.fits.positive, &b.fits.negative}) {
    if (fit->scale == 0.0f) continue;
    const float ratio = std::clamp(fit->scale / d, -40.0f, 40.0f);
    const int below = int(ratio + 40.0f) - 40;  // floor
    add(below);
    add(below + 1);
  }
  return n;
}

// Everything an IQ4_XS block stores, for one fp16 super-block scale.
struct XsChoice {
  uint16_t d_bits = 0;
  float error = INFINITY;
  int multiplier[kSubBlocks] = {};
  uint8_t codes[kSubBlocks][kGroup] = {};
};

// Each sub-block takes its best multiplier for the fp16 scale d_bits: of its candidates, the two
// the model ranks best are tried with codes chosen afresh.
XsChoice choose_multipliers(const SubBlock* subs, const Normalisation& norm, uint16_t d_bits) {
  XsChoice choice;
  choice.d_bits = d_bits;
  choice.error = 0;
  const float d = norm.half_value(d_bits);
  for (int ib = 0; ib < kSubBlocks; ++ib) {
    int m[5] = {0};
    const int n = d == 0.0f ? 1 : multiplier_candidates(subs[ib], d, m), tries = std::min(n, 2);
    float modelled[5];
    for (int c = 0; c < n; ++c) modelled[c] = modelled_error(subs[ib], d * float(m[c]));
    for (int i = 0; i < tries; ++i)  // the best `tries` to the front
      for (int c = i + 1; c < n; ++c)
        if (modelled[c] < modelled[i]) {
          std::swap(modelled[c], modelled[i]);
          std::swap(m[c], m[i]);
        }
    float best = INFINITY;
    for (int c = 0; c < tries; ++c) {
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

// Least-squares super-block scale (normalised) for a choice's multipliers and codes; 0 when they
// carry no signal.
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
  return denominator > 0 ? numerator / denominator : 0.0f;
}

// Super-block scales ranked by the model: the largest sub-block scale over k, k on a fine grid
// up to the multipliers' reach, with either sign (the multiplier range is lopsided), each rounded
// to fp16 first so that the ranking sees the scale that would be stored.
constexpr float kGridLowest = 20.0f, kGridHighest = 32.0f, kGridStep = 0.25f;
constexpr int kShortlist = 2;  // the best ranked, checked exactly

struct Shortlist {
  uint16_t d_bits[kShortlist] = {};
  float error[kShortlist];
  Shortlist() { std::fill(error, error + kShortlist, INFINITY); }

  void offer(uint16_t bits, float modelled) {
    for (int i = 0; i < kShortlist; ++i) {
      if (bits == d_bits[i] && error[i] < INFINITY) return;  // neighbouring k, same half
      if (modelled < error[i]) {
        for (int k = kShortlist - 1; k > i; --k) {
          d_bits[k] = d_bits[k - 1];
          error[k] = error[k - 1];
        }
        d_bits[i] = bits;
        error[i] = modelled;
        return;
      }
    }
  }
};

XsChoice best_xs_choice(const SubBlock* subs, const Normalisation& norm) {
  float largest = 0;
  for (int ib = 0; ib < kSubBlocks; ++ib) {
    const SignedFits& f = subs[ib].fits;
    const float better = f.positive.error <= f.negative.error ? f.positive.scale : -f.negative.scale;
    largest = std::max(largest, better);
  }
  Shortlist shortlist;
  for (float k = kGridLowest; k <= kGridHighest; k += kGridStep) {
    for (float sign : {1.0f, -1.0f}) {
      uint16_t bits = norm.half_bits(sign * largest / k);
      if ((bits & 0x7fff) == 0) bits |= 1;  // a scale below every half: try the smallest one
      shortlist.offer(bits, modelled_total_error(subs, norm.half_value(bits)));
    }
  }

  // With codes and multipliers chosen for a shortlisted scale, the least-squares scale (rounded
  // to fp16 again) may fit better still.
  XsChoice best = choose_multipliers(subs, norm, 0);  // all zero: the fallback
  auto consider = [&](float scale, int reach, uint16_t skip) {
    uint16_t candidates[1 + 2 * kNeighbours];
    const int n = half_candidates(norm, scale, reach, candidates);
    for (int c = 0; c < n; ++c) {
      if (candidates[c] == skip) continue;
      const XsChoice choice = choose_multipliers(subs, norm, candidates[c]);
      if (choice.error < best.error) best = choice;
    }
  };
  for (int i = 0; i < kShortlist && shortlist.error[i] < INFINITY; ++i) {
    const XsChoice choice = choose_multipliers(subs, norm, shortlist.d_bits[i]);
    if (choice.error < best.error) best = choice;
    consider(refit_super_scale(subs, choice), 0, choice.d_bits);
  }
  float unrounded_error = 0;  // what free sub-block scales would leave
  for (int ib = 0; ib < kSubBlocks; ++ib)
    unrounded_error += std::min(subs[ib].fits.positive.error, subs[ib].fits.negative.error);
  if (best.d_bits != 0 && rounding_dominates(best.d_bits, best.error, unrounded_error))
    consider(norm.half_value(best.d_bits), kNeighbours, best.d_bits);
  return best;
}

void write_iq4_xs_block(const XsChoice& choice, BlockIQ4_XS& block) {
  block.d = choice.d_bits;
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
  constexpr float kReach = 65504.0f * 32 * 127;  // largest half, multiplier and table magnitude
  const std::optional<Normalisation> norm = normalise(src, QK_K, kReach, normalised, "iq4_xs");
  SubBlock subs[kSubBlocks];
  for (int ib = 0; ib < kSubBlocks; ++ib) {
    Group& g = subs[ib].group;
    std::copy(normalised + ib * kGroup, normalised + (ib + 1) * kGroup, g.x);
    for (float v : g.x) g.sumxx += v * v;
  }
  if (!norm) {
    write_iq4_xs_block(choose_multipliers(subs, Normalisation{}, 0), block);
    return;
  }
  for (SubBlock& sub : subs) sub.fits = best_signed_scales(sub.group);
  write_iq4_xs_block(best_xs_choice(subs, *norm), block);
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
