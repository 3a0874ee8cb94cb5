// The log-probabilities a reply reports (OpenAI's `logprobs`): those of the model's own
// distribution, the softmax of its logits as the model gives them, before logit bias, penalties,
// temperature and truncation (what vLLM reports by default), so they say what the model thought of
// a token whatever the sampling settings.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace lode::sample {

struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;  // of `token`
  std::vector<std::pair<int32_t, float>> top;  // the likeliest tokens and theirs, best first (ties: lower id)
};

// The log-softmax of `logits` at `token`, and at the `top` likeliest tokens (0 to 20). The
// normaliser is summed in double, of exps taken in float. Fails on a token outside the row or a
// row without a finite logit.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top);

// log(sum of exp(logits)), NaN skipped: the log-softmax's normaliser. Fails on a row without a
// finite logit.
double log_normaliser(std::span<const float> logits);
// Token `index`'s probability under the softmax of logits at temperature 1 (the MTP drafters'
// --mtp-min-p test of their best token).
double probability_of(std::span<const float> logits, int32_t index);

// The most `top` may be (OpenAI's top_logprobs).
inline constexpr int kMaxTopLogprobs = 20;

}  // namespace lode::sample
