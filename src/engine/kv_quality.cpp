#include "engine/kv_quality.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "engine/perplexity.h"

namespace lode::engine {

namespace {

// log sum exp of the logits, in double.
double log_sum_exp(std::span<const float> logits) {
  double max = -INFINITY;
  for (float x : logits) max = std::max(max, double(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - max);
  return max + std::log(sum);
}

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Compares one position's distributions: `row` against fp32's.
void score_position(KvQualityRow& row, std::span<const float> reference, std::span<const float> logits,
                    int32_t next) {
  ++row.positions;
  row.kl_sum += kl_divergence(reference, logits);
  row.top1_same += argmax(reference) == argmax(logits);
  row.nll_sum += token_nll(logits, next);
}

// Each session continues greedily from its own last logits; greedy_same counts the tokens equal
// to the first (reference) session's before the first difference.
void compare_greedy(std::vector<cpu::Session>& sessions, std::vector<std::vector<float>>& last,
                    std::vector<KvQualityRow>& rows, int64_t n) {
  std::vector<std::vector<int32_t>> chosen(sessions.size());
  for (size_t s = 0; s < sessions.size(); ++s) {
    for (int64_t i = 0; i < n && sessions[s].position() < sessions[s].max_context(); ++i) {
      chosen[s].push_back(argmax(last[s]));
      if (i + 1 < n) last[s] = sessions[s].decode(chosen[s].back());
    }
  }
  for (size_t s = 0; s < sessions.size(); ++s) {
    const auto& mine = chosen[s];
    const auto& ref = chosen[0];
    rows[s].greedy_tokens = int64_t(mine.size());
    rows[s].greedy_same =
        int64_t(std::mismatch(mine.begin(), mine.end(), ref.begin(), ref.end()).first - mine.begin());
  }
}

}  // namespace

double KvQualityRow::perplexity() const { return positions ? std::exp(nll_sum / double(positions)) : NAN; }

double kl_divergence(std::span<const float> p_logits, std::span<const float> q_logits) {
  const double lp = log_sum_exp(p_logits), lq = log_sum_exp(q_logits);
  double kl = 0;
  for (size_t i = 0; i < p_logits.size(); ++i) {
    const double log_p = double(p_logits[i]) - lp, log_q = double(q_logits[i]) - lq;
    kl += std::exp(log_p) * (log_p - log_q);
  }
  return std::max(kl, 0.0);  // rounding can leave a tiny negative for identical distributions
}

std::vector<KvQualityRow> compare_kv_formats(std::shared_ptr<const cpu::ModelWeights> weights,
                                             std::span<const int32_t> tokens, const KvQualityOptions& options,
                                             const KvQualityProgress& progress) {
  const int64_t n = int64_t(tokens.size());
  if (n < 2) fail("kv-quality: the text must have at least 2 tokens, it has {}", n);
  if (options.chunk < 1) fail("kv-quality: the chunk must be at least 1 token");
  std::vector<kv::Format> formats = {options.reference};
  formats.insert(formats.end(), options.formats.begin(), options.formats.end());
  std::vector<cpu::Session> sessions;
  std::vector<KvQualityRow> rows;
  for (kv::Format f : formats) {
    cpu::SessionOptions o = options.session;
    o.kv_format = f;
    sessions.emplace_back(weights, o);
    rows.push_back({.format = f});
  }
  if (n + options.greedy_tokens > sessions[0].max_context())
    fail("kv-quality: {} tokens of text and {} greedy ones exceed the context of {}; raise --ctx or shorten the text",
         n, options.greedy_tokens, sessions[0].max_context());
  const int64_t vocab = sessions[0].vocab();
  std::vector<std::vector<float>> last(sessions.size());
  for (int64_t start = 0; start < n; start += options.chunk) {
    const auto chunk = tokens.subspan(size_t(start), size_t(std::min(options.chunk, n - start)));
    std::vector<std::vector<float>> logits;
    for (cpu::Session& s : sessions) logits.push_back(s.prefill(chunk, int64_t(chunk.size()), true));
    for (int64_t i = 0; i < int64_t(chunk.size()); ++i) {
      const auto at = [&](size_t s) { return std::span(logits[s]).subspan(size_t(i * vocab), size_t(vocab)); };
      if (start + i + 1 < n)
        for (size_t s = 0; s < sessions.size(); ++s) score_position(rows[s], at(0), at(s), tokens[size_t(start + i + 1)]);
    }
    for (size_t s = 0; s < sessions.size(); ++s) last[s].assign(logits[s].end() - vocab, logits[s].end());
    if (progress) progress(start + int64_t(chunk.size()), n);
  }
  compare_greedy(sessions, last, rows, options.greedy_tokens);
  return rows;
}

}  // namespace lode::engine
