#include "engine/engine.h"

#include <algorithm>

#include "core/error.h"

namespace lode::engine {

std::vector<std::vector<int32_t>> Model::draft_together(std::span<const DraftAsk> asks) {
  std::vector<std::vector<int32_t>> drafts;
  for (const DraftAsk& a : asks) drafts.push_back(a.n > 0 ? a.drafter->draft(a.pending, a.n, a.min_p) : std::vector<int32_t>{});
  return drafts;
}

std::vector<float> prefill(Sequence& sequence, std::span<const int32_t> tokens, int64_t chunk, bool all_logits,
                           const ChunkStates& on_chunk) {
  Model& model = sequence.model();
  const int64_t n = int64_t(tokens.size());
  if (n == 0) {  // the backend refuses it, in its own words
    StepRow row{.sequence = &sequence, .tokens = tokens, .logit_rows = 0};
    model.step(std::span(&row, 1));
    return {};
  }
  if (chunk <= 0 || chunk > n || model.chunks_prompts()) chunk = n;
  std::vector<float> logits;
  logits.reserve(size_t((all_logits ? n : 1) * model.vocab()));
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    const bool last = start + len == n;
    StepRow row{.sequence = &sequence, .tokens = tokens.subspan(size_t(start), size_t(len)),
                .logit_rows = all_logits ? len : (last ? 1 : 0), .want_hidden = bool(on_chunk)};
    model.step(std::span(&row, 1));
    if (on_chunk) on_chunk(row.tokens, row.hidden);
    logits.insert(logits.end(), row.logits.begin(), row.logits.end());
  }
  return logits;
}

Drafter& Sequence::drafter() {
  fail("this engine cannot draft tokens (MTP speculative decoding runs on the CPU engine, and on the GPU with --mtp)");
}

FollowedRows followed_rows(std::span<const int32_t> tokens, std::span<const float> hidden,
                           std::span<const float> last_hidden, int64_t followed, int64_t width) {
  const int64_t n = int64_t(tokens.size());
  if (int64_t(hidden.size()) != n * width)
    fail("mtp drafter: {} hidden values for {} tokens of {} each", hidden.size(), n, width);
  FollowedRows rows{.tokens = tokens, .before = {}, .first = followed};
  if (n == 0) return rows;
  if (last_hidden.empty()) {
    rows.tokens = tokens.subspan(1);
    rows.before.assign(hidden.begin(), hidden.begin() + (n - 1) * width);
    ++rows.first;
  } else {
    rows.before.assign(last_hidden.begin(), last_hidden.end());
    rows.before.insert(rows.before.end(), hidden.begin(), hidden.begin() + (n - 1) * width);
  }
  return rows;
}

void Sequence::cut_window(int64_t) {
  fail("this engine cannot cut a verify window: rewind to a checkpoint taken before it instead");
}

std::vector<float> decode(Sequence& sequence, int32_t token) {
  StepRow row{.sequence = &sequence, .tokens = std::span(&token, 1)};
  sequence.model().step(std::span(&row, 1));
  return std::move(row.logits);
}

sample::TopCandidates decode_top(Sequence& sequence, int32_t token, std::span<const int32_t> aside) {
  StepRow row{.sequence = &sequence, .tokens = std::span(&token, 1), .top_only = true, .top_aside = aside};
  sequence.model().step(std::span(&row, 1));
  return std::move(row.top);
}

void top_from_logits(StepRow& row) {
  row.top = sample::top_candidates(row.logits, sample::kTopCandidates, row.top_aside);
  row.logits.clear();
}

void greedy_from_logits(StepRow& row) {
  const size_t vocab = size_t(row.sequence->model().vocab());
  row.greedy.clear();
  for (size_t at = 0; at + vocab <= row.logits.size(); at += vocab)
    row.greedy.push_back(sample::greedy(std::span(row.logits).subspan(at, vocab)));
  row.logits.clear();
}

int32_t decode_greedy(Sequence& sequence, int32_t token) {
  StepRow row{.sequence = &sequence, .tokens = std::span(&token, 1), .greedy_only = true};
  sequence.model().step(std::span(&row, 1));
  if (row.greedy.size() != 1) fail("engine: the backend gave {} greedy tokens for one logit row", row.greedy.size());
  return row.greedy[0];
}

}  // namespace lode::engine
