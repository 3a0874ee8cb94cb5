#include "cuda/mtp_drafter.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "cuda/on_device.h"
#include "kv/format.h"

namespace lode::cuda {

GpuDrafter::GpuDrafter(CudaSession& session) : session_(session), sequence_(session.sequence()) {
  if (!session.has_mtp()) fail("--mtp: this GPU session was opened without the MTP block");
}

std::string GpuDrafter::describe() const {
  return fmt::format("MTP drafter on the GPU, its K/V cache {}",
                     kv::to_string(kv::mtp_format(session_.config().head_dim, session_.kv_format())));
}

void GpuDrafter::reset(int64_t position) {
  last_hidden_.clear();
  start_ = position, seen_ = 0, rows_ = 0;
}

void GpuDrafter::advance(std::span<const int32_t> tokens, std::span<const float> hidden) {
  const int64_t h = session_.config().hidden, n = int64_t(tokens.size());
  const engine::FollowedRows rows = engine::followed_rows(tokens, hidden, last_hidden_, followed(), h);
  if (n == 0) return;
  if (!rows.tokens.empty()) {  // committed rows are never drafted from: their K/V is all that is needed
    const OnDevice on(session_.device());  // (the engine's other calls go through cuda/pipeline.h, which does this)
    session_.mtp_append(sequence_, rows.tokens, rows.before, rows_, shift());
    rows_ += int64_t(rows.tokens.size());
  }
  last_hidden_.assign(hidden.end() - h, hidden.end());
  seen_ += n;
}

std::vector<int32_t> GpuDrafter::draft(int32_t pending, int64_t n, float min_p) {
  GpuDrafter* self = this;
  const engine::DraftAsk ask{this, pending, n, min_p};
  return draft_together(std::span(&self, 1), std::span(&ask, 1)).front();
}

std::vector<std::vector<int32_t>> GpuDrafter::draft_together(std::span<GpuDrafter* const> drafters,
                                                             std::span<const engine::DraftAsk> asks) {
  std::vector<std::vector<int32_t>> drafts(drafters.size());
  const std::vector<size_t> live =
      engine::drafting(drafters, asks, [](const GpuDrafter& d) { return !d.last_hidden_.empty(); });
  if (live.empty()) return drafts;
  CudaSession& session = drafters[live.front()]->session_;
  const OnDevice on(session.device());
  std::vector<int64_t> sequences, rows, shifts, wanted;
  std::vector<int32_t> tokens;
  std::vector<float> hidden, probabilities;
  bool with_probabilities = false;
  for (const size_t i : live) {
    const GpuDrafter& d = *drafters[i];
    if (&d.session_ != &session) fail("cuda drafter: drafts together for drafters of one session only");
    sequences.push_back(d.sequence_), rows.push_back(d.rows_), shifts.push_back(d.shift());
    tokens.push_back(asks[i].pending), hidden.insert(hidden.end(), d.last_hidden_.begin(), d.last_hidden_.end());
    wanted.push_back(std::min(asks[i].n, session.max_context() - d.rows_));  // (as draft(): rows within the context)
    with_probabilities = with_probabilities || asks[i].min_p > 0;
  }
  const int64_t most = *std::ranges::max_element(wanted);
  std::vector<int32_t> out(live.size());
  if (with_probabilities) probabilities.resize(live.size());
  std::vector<bool> going(live.size(), true);
  // Every row stays in every step (a step's rows pair with the outputs of the step before, row by
  // row), those done drafting at a row the context holds; their extra drafts are dropped.
  std::vector<int64_t> at(live.size());
  for (int64_t step = 0; step < most && std::find(going.begin(), going.end(), true) != going.end(); ++step) {
    for (size_t t = 0; t < live.size(); ++t) at[t] = std::min(rows[t] + step, session.max_context() - 1);
    session.mtp_draft_rows(sequences, tokens, step == 0 ? std::span<const float>(hidden) : std::span<const float>(),
                           at, shifts, out, probabilities);
    for (size_t t = 0; t < live.size(); ++t) {
      const float min_p = asks[live[t]].min_p;
      going[t] = going[t] && step < wanted[t] && !(min_p > 0 && probabilities[t] < min_p);
      if (going[t]) drafts[live[t]].push_back(out[t]);
    }
    tokens = out;
  }
  return drafts;
}

}  // namespace lode::cuda
