#include "sample/logprobs.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "sample/sampler.h"

namespace lode::sample {

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top) {
  if (token < 0 || size_t(token) >= logits.size())
    fail("logprobs: token {} is outside the row of {} logits", token, logits.size());
  if (top < 0 || top > kMaxTopLogprobs) fail("logprobs: {} top tokens asked for; 0 to {} may be", top, kMaxTopLogprobs);
  float most = -std::numeric_limits<float>::infinity();
  for (float l : logits)
    if (l > most) most = l;  // (NaN never compares greater)
  if (!std::isfinite(most)) fail("logprobs: the row of logits has no finite value");
  double sum = 0;  // (each term's exp in float, a rounding of 1e-7 at most: the entries are floats)
  for (float l : logits)
    if (l == l) sum += double(std::exp(l - most));
  const double log_normaliser = double(most) + std::log(sum);
  const auto logprob = [&](float l) { return float(double(l) - log_normaliser); };
  TokenLogprobs out{.token = token, .logprob = logprob(logits[size_t(token)]), .top = {}};
  if (top > 0)
    for (const Scored& s : top_candidates(logits, top).best) out.top.emplace_back(s.id, logprob(s.logit));
  return out;
}

}  // namespace lode::sample
