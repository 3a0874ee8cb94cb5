#include "sample/logprobs.h"

#include <immintrin.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/host_isa.h"
#include "sample/sampler.h"

namespace lode::sample {

namespace {

// The sum of exp(x - shift) over the row, NaN skipped; each exp in float, the sum in double.
double exp_sum_plain(std::span<const float> x, float shift) {
  double sum = 0;
  for (float l : x)
    if (l == l) sum += double(std::exp(l - shift));
  return sum;
}

// The same eight at a time: exp(t) = 2^n exp(r), n = round(t / ln 2), r = t - n ln 2 (in two
// parts), exp(r) by its Taylor polynomial to r^6 (|r| <= ln 2 / 2: a relative error near 2e-7,
// against std::exp's float); t below -87 (whose exp float barely holds) counts as 0, as do NaNs.
__attribute__((target("avx2"))) double exp_sum_avx2(std::span<const float> x, float shift) {
  const __m256 log2e = _mm256_set1_ps(1.44269504f), ln2_hi = _mm256_set1_ps(0.693359375f),
               ln2_lo = _mm256_set1_ps(-2.12194440e-4f), lowest = _mm256_set1_ps(-87.0f),
               s = _mm256_set1_ps(shift), one = _mm256_set1_ps(1.0f);
  const float c[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f};
  __m256d sum_lo = _mm256_setzero_pd(), sum_hi = _mm256_setzero_pd();
  size_t i = 0;
  for (; i + 8 <= x.size(); i += 8) {
    const __m256 v = _mm256_loadu_ps(x.data() + i);
    const __m256 t = _mm256_max_ps(_mm256_sub_ps(v, s), lowest);  // (NaN becomes -87 here, masked below)
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(t, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(t, _mm256_mul_ps(n, ln2_hi)), _mm256_mul_ps(n, ln2_lo));
    __m256 p = _mm256_set1_ps(c[0]);
    for (int k = 1; k < 5; ++k) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c[k]));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
    const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
    const __m256 kept = _mm256_and_ps(_mm256_cmp_ps(v, v, _CMP_ORD_Q), _mm256_cmp_ps(t, lowest, _CMP_GT_OQ));
    e = _mm256_and_ps(e, kept);
    sum_lo = _mm256_add_pd(sum_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    sum_hi = _mm256_add_pd(sum_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(sum_lo, sum_hi));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + exp_sum_plain(x.subspan(i), shift);
}

}  // namespace

double log_normaliser(std::span<const float> logits) {
  float most = -std::numeric_limits<float>::infinity();
  for (float l : logits)
    if (l > most) most = l;  // (NaN never compares greater)
  if (!std::isfinite(most)) fail("logprobs: the row of logits has no finite value");
  const double sum = host_has_avx2() ? exp_sum_avx2(logits, most) : exp_sum_plain(logits, most);
  return double(most) + std::log(sum);
}

double probability_of(std::span<const float> logits, int32_t index) {
  return std::exp(double(logits[size_t(index)]) - log_normaliser(logits));
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top) {
  if (token < 0 || size_t(token) >= logits.size())
    fail("logprobs: token {} is outside the row of {} logits", token, logits.size());
  if (top < 0 || top > kMaxTopLogprobs) fail("logprobs: {} top tokens asked for; 0 to {} may be", top, kMaxTopLogprobs);
  const double normaliser = log_normaliser(logits);
  const auto logprob = [&](float l) { return float(double(l) - normaliser); };
  TokenLogprobs out{.token = token, .logprob = logprob(logits[size_t(token)]), .top = {}};
  if (top > 0)
    for (const Scored& s : top_candidates(logits, top).best) out.top.emplace_back(s.id, logprob(s.logit));
  return out;
}

}  // namespace lode::sample
