#include "engine/kv_quality.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "engine/perplexity.h"

namespace lode::engine {

namespace {

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Scores every position of a chunk but the text's last: `row` against the reference's logits,
// positions in parallel (each KL is a pass over the vocabulary), then added in position order (an
// OpenMP reduction adds its threads' sums in the order they finish: the totals would vary from run
// to run with more than two threads).
void score_chunk(KvQualityRow& row, const std::vector<float>& reference, const std::vector<float>& logits,
                 int64_t vocab, std::span<const int32_t> next_tokens) {
  const int64_t n = int64_t(next_tokens.size());
  std::vector<double> kl(static_cast<size_t>(n)), nll(static_cast<size_t>(n));
  std::vector<uint8_t> same(static_cast<size_t>(n));
  std::exception_ptr failure;  // (nothing may leave an OpenMP loop: the first failure is thrown after it)
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    try {
      const auto ref = std::span(reference).subspan(size_t(i * vocab), size_t(vocab));
      const auto mine = std::span(logits).subspan(size_t(i * vocab), size_t(vocab));
      kl[size_t(i)] = kl_divergence(ref, mine);
      same[size_t(i)] = argmax(ref) == argmax(mine);
      nll[size_t(i)] = token_nll(mine, next_tokens[size_t(i)]);
    } catch (...) {
#pragma omp critical(kv_quality_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  row.positions += n;
  for (int64_t i = 0; i < n; ++i) {
    row.kl_sum += kl[size_t(i)];
    row.top1_same += same[size_t(i)];
    row.nll_sum += nll[size_t(i)];
  }
}

// Each sequence continues greedily from its own last logits for n tokens (or until its context is
// full).
std::vector<std::vector<int32_t>> continue_greedily(std::vector<std::unique_ptr<Sequence>>& sequences,
                                                    std::vector<std::vector<float>>& last, int64_t n) {
  std::vector<std::vector<int32_t>> chosen(sequences.size());
  for (size_t s = 0; s < sequences.size(); ++s)
    for (int64_t i = 0; i < n && sequences[s]->position() < sequences[s]->max_context(); ++i) {
      chosen[s].push_back(argmax(last[s]));
      if (i + 1 < n) last[s] = decode(*sequences[s], chosen[s].back());
    }
  return chosen;
}

// greedy_same: the tokens equal to the reference's before the first that differs.
void count_greedy(KvQualityRow& row, const std::vector<int32_t>& mine, const std::vector<int32_t>& reference) {
  row.greedy_tokens = int64_t(mine.size());
  row.greedy_same =
      int64_t(std::mismatch(mine.begin(), mine.end(), reference.begin(), reference.end()).first - mine.begin());
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

std::vector<KvQualityRow> compare_kv_formats(const OpenSequence& open, std::span<const int32_t> tokens,
                                             const KvQualityOptions& options, const KvQualityProgress& progress) {
  const int64_t n = int64_t(tokens.size());
  if (n < 2) fail("kv-quality: the text must have at least 2 tokens, it has {}", n);
  if (options.chunk < 1) fail("kv-quality: the chunk must be at least 1 token");
  const int64_t context = n + options.greedy_tokens;
  std::vector<KvQualityRow> rows = {{.format = options.reference}};
  for (kv::Format f : options.formats) rows.push_back({.format = f});
  const int64_t others = int64_t(options.formats.size());
  const int64_t per_pass = options.formats_per_pass > 0 ? options.formats_per_pass : std::max<int64_t>(others, 1);
  const int64_t passes = std::max<int64_t>((others + per_pass - 1) / per_pass, 1);
  std::vector<int32_t> reference_greedy;
  for (int64_t pass = 0; pass < passes; ++pass) {
    // rows[0] (the reference) and rows[first .. first + count) in this pass.
    const int64_t first = 1 + pass * per_pass, count = std::min(per_pass, others - pass * per_pass);
    std::vector<std::unique_ptr<Sequence>> sequences;
    sequences.push_back(open(options.reference, context));
    for (int64_t r = first; r < first + count; ++r) sequences.push_back(open(rows[size_t(r)].format, context));
    const int64_t vocab = sequences[0]->model().vocab();
    std::vector<std::vector<float>> last(sequences.size());
    const int64_t unscored = options.scored_positions > 0 ? std::max<int64_t>(n - options.scored_positions, 0) : 0;
    for (int64_t start = 0; start < unscored; start += options.chunk) {
      const auto chunk = tokens.subspan(size_t(start), size_t(std::min(options.chunk, unscored - start)));
      for (auto& s : sequences) prefill(*s, chunk, int64_t(chunk.size()));
      if (progress) progress(pass * n + start + int64_t(chunk.size()), passes * n);
    }
    for (int64_t start = unscored; start < n; start += options.chunk) {
      const auto chunk = tokens.subspan(size_t(start), size_t(std::min(options.chunk, n - start)));
      std::vector<std::vector<float>> logits;
      for (auto& s : sequences) logits.push_back(prefill(*s, chunk, int64_t(chunk.size()), true));
      // The next token of every position of the chunk but the text's last.
      const auto next = tokens.subspan(size_t(start + 1), size_t(std::min<int64_t>(int64_t(chunk.size()), n - 1 - start)));
      if (pass == 0) score_chunk(rows[0], logits[0], logits[0], vocab, next);
      for (int64_t r = 0; r < count; ++r) score_chunk(rows[size_t(first + r)], logits[0], logits[size_t(r + 1)], vocab, next);
      for (size_t s = 0; s < sequences.size(); ++s) last[s].assign(logits[s].end() - vocab, logits[s].end());
      if (progress) progress(pass * n + start + int64_t(chunk.size()), passes * n);
    }
    const auto chosen = continue_greedily(sequences, last, options.greedy_tokens);
    if (pass == 0) {
      reference_greedy = chosen[0];
      count_greedy(rows[0], chosen[0], reference_greedy);
    }
    for (int64_t r = 0; r < count; ++r) count_greedy(rows[size_t(first + r)], chosen[size_t(r + 1)], reference_greedy);
  }
  return rows;
}

}  // namespace lode::engine
