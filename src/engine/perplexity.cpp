#include "engine/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace lode::engine {
namespace {

void check_options(const Sequence& sequence, int64_t n_tokens, const PerplexityOptions& o) {
  if (o.ctx < 2) fail("perplexity: --ctx {} is too small; a window needs at least 2 tokens", o.ctx);
  if (o.chunk < 1) fail("perplexity: --chunk {} must be at least 1", o.chunk);
  if (o.max_windows < 0) fail("perplexity: --max-windows {} must be 0 (all) or more", o.max_windows);
  const int64_t model_ctx = sequence.model().config().context_length;
  if (model_ctx > 0 && o.ctx > model_ctx)
    fail("perplexity: --ctx {} exceeds the model's context length of {}; pass a smaller --ctx",
         o.ctx, model_ctx);
  if (n_tokens < 2)
    fail("perplexity: the text has {} token(s); at least 2 are needed to score one", n_tokens);
}

// Runs one window from an empty state, `chunk` positions per forward call, and adds the NLL of
// every token after the first to `total`. Only chunk x vocab logits are held at a time: a whole
// window's would be ctx x vocab (1 GB at 1024 x 250k).
void score_window(Sequence& sequence, std::span<const int32_t> window, int64_t chunk,
                  PerplexityResult& total) {
  sequence.reset();
  const int64_t n = int64_t(window.size()), vocab = sequence.model().vocab();
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    const std::vector<float> logits = prefill(sequence, window.subspan(size_t(start), size_t(len)), len, true);
    // Row r holds the prediction for position start + r + 1; the window's last row predicts
    // nothing inside it.
    for (int64_t r = 0; r < len && start + r + 1 < n; ++r) {
      const std::span<const float> row(logits.data() + r * vocab, size_t(vocab));
      total.nll_sum += token_nll(row, window[size_t(start + r + 1)]);
      ++total.scored;
    }
  }
}

}  // namespace

double PerplexityResult::mean_nll() const {
  return scored > 0 ? nll_sum / double(scored) : std::numeric_limits<double>::quiet_NaN();
}

double PerplexityResult::perplexity() const { return std::exp(mean_nll()); }

double PerplexityResult::bits_per_byte() const {
  return text_bytes > 0 ? nll_sum / std::log(2.0) / double(text_bytes)
                        : std::numeric_limits<double>::quiet_NaN();
}

double log_sum_exp(std::span<const float> logits) {
  double max = -std::numeric_limits<double>::infinity();
  for (float x : logits) max = std::max(max, double(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - max);
  const double result = max + std::log(sum);
  if (!std::isfinite(result))
    fail("a row of logits holds a value that is not finite (NaN, or infinite where all are): check the weights and the "
         "backend that made them");
  return result;
}

double token_nll(std::span<const float> logits, int32_t target) {
  if (target < 0 || size_t(target) >= logits.size())
    fail("perplexity: token id {} is outside the vocabulary [0, {})", target, logits.size());
  return log_sum_exp(logits) - double(logits[size_t(target)]);
}

int64_t perplexity_windows(int64_t n_tokens, int64_t ctx) {
  if (ctx < 1 || n_tokens < 0) return 0;
  const int64_t full = n_tokens / ctx;
  return full + (n_tokens % ctx >= 2 ? 1 : 0);
}

PerplexityResult perplexity(Sequence& sequence, std::span<const int32_t> tokens,
                            const PerplexityOptions& options, const WindowSink& on_window) {
  const int64_t n_tokens = int64_t(tokens.size());
  check_options(sequence, n_tokens, options);
  int64_t windows = perplexity_windows(n_tokens, options.ctx);
  if (options.max_windows > 0) windows = std::min(windows, options.max_windows);

  PerplexityResult result;
  const auto began = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t start = w * options.ctx;
    const int64_t len = std::min(options.ctx, n_tokens - start);
    score_window(sequence, tokens.subspan(size_t(start), size_t(len)), options.chunk, result);
    ++result.windows;
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    if (on_window) on_window(w + 1, windows, result);
  }
  return result;
}

}  // namespace lode::engine
