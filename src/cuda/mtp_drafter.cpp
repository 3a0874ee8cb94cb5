#include "cuda/mtp_drafter.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "cuda/forward_kernels.h"
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
  forget_armed();
}

void GpuDrafter::forget_armed() { drafted_.reset(), armed_.reset(), ready_.reset(); }

std::optional<CudaSession::WindowDrafts> GpuDrafter::arming(std::span<const int32_t> window) {
  armed_.reset();
  const int64_t n = int64_t(window.size());
  const bool drafted_it = drafted_ && drafted_->pending == window.front() && drafted_->at == followed() &&
                          drafted_->row == rows_;  // (so its first token's row is written)
  if (n < 2 || !drafted_it || !session_.arms_drafts() || rows_ + 1 + n > session_.max_context()) return std::nullopt;
  armed_ = Armed{.at = followed(), .row = rows_, .window = {window.begin(), window.end()}};
  // (the second draft's K/V row is at most the one after the window's)
  const bool continues = drafted_->wanted > 1 && n <= kernels::kMaxWindowTokens && rows_ + 2 + n <= session_.max_context();
  return CudaSession::WindowDrafts{.sequence = sequence_, .first_row = rows_ + 1, .shift = shift(), .continues = continues};
}

void GpuDrafter::armed(std::span<const int32_t> greedy, std::span<const int32_t> drafts, int32_t continued) {
  if (!armed_ || greedy.size() != armed_->window.size() || drafts.size() != greedy.size()) return armed_.reset();
  Armed& a = *armed_;
  a.greedy.assign(greedy.begin(), greedy.end());
  a.drafts.assign(drafts.begin(), drafts.end());
  a.serial = session_.armed_windows();
  a.continued = continued;
  for (a.kept = 1; a.kept < int64_t(a.window.size()) && a.window[size_t(a.kept)] == a.greedy[size_t(a.kept - 1)];) ++a.kept;
}

// Whether `tokens`, about to be followed, are a start of the armed window whose rows its step
// wrote: the window's first token at the position and row it was armed at, then tokens that are
// the greedy tokens the step paired its rows with.
bool GpuDrafter::takes_armed_rows(std::span<const int32_t> tokens) const {
  if (!armed_ || armed_->drafts.empty() || armed_->at != followed() || armed_->row != rows_) return false;
  const Armed& a = *armed_;
  if (tokens.empty() || tokens.size() > a.window.size()) return false;
  for (size_t t = 0; t < tokens.size(); ++t)
    if (tokens[t] != a.window[t] || (t > 0 && tokens[t] != a.greedy[t - 1])) return false;
  return true;
}

bool GpuDrafter::ready_for(const engine::DraftAsk& ask) const {
  return ready_ && ask.min_p <= 0 && ready_->pending == ask.pending && ready_->at == followed() &&
         ready_->serial == session_.armed_windows();
}

void GpuDrafter::advance(std::span<const int32_t> tokens, std::span<const float> hidden) {
  const int64_t h = session_.config().hidden, n = int64_t(tokens.size());
  if (n == 0) return;
  if (takes_armed_rows(tokens)) {  // their rows are written; the next draft is the step's last kept row's
    const Armed& a = *armed_;
    // (the continued draft went on from the row of the last token greedy acceptance keeps)
    ready_ = Ready{.pending = a.greedy[size_t(n - 1)], .draft = a.drafts[size_t(n - 1)], .at = followed() + n,
                   .row = n - 1, .serial = a.serial, .second = n == a.kept ? a.continued : -1,
                   .second_row = int64_t(a.window.size())};
    rows_ += n, seen_ += n;
    last_hidden_.assign(hidden.end() - h, hidden.end());
    drafted_.reset(), armed_.reset();
    return;
  }
  forget_armed();
  const engine::FollowedRows rows = engine::followed_rows(tokens, hidden, last_hidden_, followed(), h);
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
  if (live.empty()) {
    for (GpuDrafter* d : drafters) d->forget_armed();
    return drafts;
  }
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
  int64_t step = 0;
  // A lone drafter whose window's verify step drafted its first draft: that one, then steps of the
  // block from that step's row (no minimum probability: the step copied no logits).
  GpuDrafter& lone = *drafters[live.front()];
  if (live.size() == 1 && wanted.front() > 0 && lone.ready_for(asks[live.front()])) {
    if (lone.ready_->draft < 0)  // (as mtp_draft_rows fails)
      fail("cuda session: the MTP block's logits hold NaN or +inf, or are all -inf (a damaged model file?)");
    out[0] = lone.ready_->draft, tokens = out, step = 1;
    drafts[live.front()].push_back(out[0]);
    ++lone.armed_drafts_;
    const bool second = most > 1 && lone.ready_->second >= 0;  // (and the step continued to the next one)
    if (second) {
      out[0] = lone.ready_->second, tokens = out, step = 2;
      drafts[live.front()].push_back(out[0]);
      ++lone.continued_drafts_;
    }
    if (most > step) session.mtp_continue_from_armed(second ? lone.ready_->second_row : lone.ready_->row);
  }
  // Every row stays in every step (a step's rows pair with the outputs of the step before, row by
  // row), those done drafting at a row the context holds; their extra drafts are dropped.
  std::vector<int64_t> at(live.size());
  for (; step < most && std::find(going.begin(), going.end(), true) != going.end(); ++step) {
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
  // What each drafted from (a window of these drafts can arm the next ones: arming()).
  for (GpuDrafter* d : drafters) d->forget_armed();
  for (size_t t = 0; t < live.size(); ++t) {
    GpuDrafter& d = *drafters[live[t]];
    if (asks[live[t]].min_p <= 0)
      d.drafted_ = Drafted{.pending = asks[live[t]].pending, .at = d.followed(), .row = d.rows_, .wanted = asks[live[t]].n};
  }
  return drafts;
}

}  // namespace lode::cuda
