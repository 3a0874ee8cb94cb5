// Perplexity of a model over a tokenized text (`lode ppl`), on any engine (engine/engine.h).
//
// Definition (a Python twin in transformers computes the same numbers):
//   * The text is tokenized once (allow_special = false, no BOS) by the caller.
//   * The tokens are cut into consecutive, non-overlapping windows of `ctx` tokens; the last,
//     shorter window is kept when it has at least 2 tokens (a 1-token remainder is dropped).
//   * Each window is evaluated from an empty state: the model sees only that window.
//   * In a window w[0..L), every position i >= 1 is scored: NLL_i = -log softmax(logits(w[0..i)))[w[i]],
//     the log-softmax taken in double precision over the float32 logits.
//   * perplexity = exp(sum NLL / scored tokens); mean NLL in nats/token;
//     bits per byte = sum NLL / ln 2 / bytes of text (text_bytes, set by the caller: see
//     PerplexityResult::text_bytes).
// Windows are independent, so results over several windows combine by adding nll_sum and scored.
#pragma once
#include <cstdint>
#include <functional>
#include <span>

#include "engine/engine.h"

namespace lode::engine {

struct PerplexityOptions {
  int64_t ctx = 1024;       // tokens per window (>= 2; at most the model's context length)
  int64_t chunk = 64;       // positions per forward call: bounds the logits held at once to
                            // chunk x vocab floats; the result does not depend on it
  int64_t max_windows = 0;  // evaluate at most this many windows, from the start; 0: all
};

struct PerplexityResult {
  double nll_sum = 0;      // nats, summed over the scored tokens
  int64_t scored = 0;      // tokens scored (each window's length minus its first token)
  int64_t windows = 0;     // windows evaluated
  int64_t text_bytes = 0;  // bytes of the text the windows cover; perplexity() leaves it 0 (it
                           // sees only tokens), the caller fills it in for bits_per_byte()
  double seconds = 0;      // wall time of the evaluation

  double perplexity() const;     // exp(mean_nll()); NaN when nothing was scored
  double mean_nll() const;       // nats per scored token; NaN when nothing was scored
  double bits_per_byte() const;  // NaN when text_bytes is 0
  // Tokens run through the model: every window's tokens, its unscored first one included.
  int64_t evaluated_tokens() const { return scored + windows; }
};

// Called after each window: (windows done, windows to do, totals so far).
using WindowSink = std::function<void(int64_t window, int64_t windows, const PerplexityResult& so_far)>;

// Number of windows `n_tokens` tokens make at `ctx` tokens each (the definition above).
int64_t perplexity_windows(int64_t n_tokens, int64_t ctx);

// Evaluates the windows of `tokens` on `sequence` (reset before each window and left holding the
// last one). Fails when ctx < 2, chunk < 1, max_windows < 0, there are fewer than 2 tokens, or
// ctx exceeds the model's context length.
PerplexityResult perplexity(Sequence& sequence, std::span<const int32_t> tokens,
                            const PerplexityOptions& options, const WindowSink& on_window = {});

// -log softmax(logits)[target], in double precision.
double token_nll(std::span<const float> logits, int32_t target);

// log sum exp of a row of logits, in double; fails when a logit is NaN or every one is infinite
// (the model produced invalid values), saying so.
double log_sum_exp(std::span<const float> logits);

}  // namespace lode::engine
