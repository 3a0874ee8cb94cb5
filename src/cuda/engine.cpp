#include "cuda/engine.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "cuda/mtp_drafter.h"
#include "sample/sampler.h"

namespace lode::cuda {
namespace {

struct CudaCheckpoint final : engine::Checkpoint {
  explicit CudaCheckpoint(CudaSession::Snapshot s) : snapshot(std::move(s)) {}
  int64_t position() const override { return snapshot.positions; }
  int64_t bytes() const override { return int64_t(snapshot.cells.size() + snapshot.states.size() * sizeof(float)); }
  CudaSession::Snapshot snapshot;
};

const CudaSession::Snapshot& snapshot_of(const engine::Checkpoint& checkpoint) {
  const auto* c = dynamic_cast<const CudaCheckpoint*>(&checkpoint);
  if (!c) fail("cuda engine: the checkpoint was taken by another backend");
  return c->snapshot;
}

}  // namespace

class CudaSequence final : public engine::Sequence {
 public:
  explicit CudaSequence(std::shared_ptr<CudaModel> model) : model_(std::move(model)) {}
  ~CudaSequence() override { model_->sequence_open_ = false; }

  engine::Model& model() const override { return *model_; }
  int64_t position() const override { return session().position(); }
  int64_t max_context() const override { return session().max_context(); }
  int64_t kv_bytes() const override { return session().kv_bytes(); }
  void reset() override { session().reset(); }
  std::shared_ptr<const engine::Checkpoint> checkpoint() const override {
    return std::make_shared<CudaCheckpoint>(session().save());
  }
  void rewind(const engine::Checkpoint& checkpoint) override {
    if (checkpoint.position() > position())
      fail("cuda engine: cannot rewind to position {}: the sequence holds {} positions", checkpoint.position(),
           position());
    session().restore(snapshot_of(checkpoint));
  }
  // The model holds one sequence: a prefix can only come from this one (which restore() then is).
  void copy_prefix(const engine::Sequence& other, const engine::Checkpoint& checkpoint) override {
    if (&other.model() != &model()) fail("cuda engine: cannot copy a prefix from another model's sequence");
    session().restore(snapshot_of(checkpoint));
  }

  bool cuts_windows() const override { return session().step_rows() > 1; }
  // Within the last window of the last row computed as decode steps (the session keeps its states).
  void cut_window(int64_t tokens) override {
    CudaModel& m = *model_;
    if (tokens == m.row_tokens_) return;  // nothing to cut
    if (tokens < m.window_offset_ || tokens > m.row_tokens_)
      fail("cuda engine: cannot cut a verify row of {} tokens to {}: the GPU keeps the states of its last window "
           "(from token {} on)", m.row_tokens_, tokens, m.window_offset_);
    session().cut_window(tokens - m.window_offset_);
    m.row_tokens_ = tokens;
  }

  // The GPU's MTP drafter, when the session holds the block (CudaSessionOptions::mtp).
  engine::Drafter& drafter() override {
    if (!drafter_) drafter_ = std::make_unique<GpuDrafter>(session());
    return *drafter_;
  }

  CudaSession& session() const { return *model_->session_; }

 private:
  std::shared_ptr<CudaModel> model_;
  std::unique_ptr<GpuDrafter> drafter_;
};

std::unique_ptr<engine::Sequence> CudaModel::open_sequence() {
  if (sequence_open_)
    fail("cuda engine: this model already holds its one sequence (several sequences on the GPU come with GPU "
         "serving)");
  auto sequence = std::make_unique<CudaSequence>(std::static_pointer_cast<CudaModel>(shared_from_this()));
  sequence_open_ = true;
  return sequence;
}

namespace {

// A row computed as decode steps compute it (StepRow::as_decode): windows of at most the session's
// step_rows tokens, each a one-step verify window; the last one's first token is at window_offset.
void decode_rows(CudaSession& session, engine::StepRow& row, int64_t& window_offset) {
  const int64_t n = int64_t(row.tokens.size()), vocab = session.vocab(), hidden = session.config().hidden;
  const int64_t most = session.step_rows();
  const bool all_logits = row.logit_rows == n && !row.greedy_only;
  row.logits.clear(), row.hidden.clear();
  if (all_logits) row.logits.reserve(size_t(n * vocab));
  if (row.want_hidden) row.hidden.reserve(size_t(n * hidden));
  for (int64_t at = 0; at < n; at += most) {
    const auto tokens = row.tokens.subspan(size_t(at), size_t(std::min(most, n - at)));
    const bool last = at + int64_t(tokens.size()) == n;
    const bool greedy = row.greedy_only && last;
    window_offset = at;
    CudaSession::Window w = session.decode_window(tokens, greedy, row.want_hidden);
    if (all_logits) row.logits.insert(row.logits.end(), w.logits.begin(), w.logits.end());
    else if (last && row.logit_rows == 1 && !greedy) row.logits.assign(w.logits.end() - vocab, w.logits.end());
    if (greedy) row.greedy = w.greedy.back();
    if (row.want_hidden) row.hidden.insert(row.hidden.end(), w.hidden.begin(), w.hidden.end());
  }
}

}  // namespace

void CudaModel::step(std::span<engine::StepRow> rows) {
  if (rows.size() != 1) fail("cuda engine: a step runs one sequence on the GPU, {} were given", rows.size());
  engine::StepRow& row = rows[0];
  const auto* sequence = dynamic_cast<const CudaSequence*>(row.sequence);
  if (!sequence || &sequence->model() != this) fail("cuda engine: a step row names no sequence of this model");
  const int64_t n = int64_t(row.tokens.size());
  if (row.logit_rows < 0 || row.logit_rows > n || (row.logit_rows > 1 && row.logit_rows < n))
    fail("cuda engine: {} logit rows asked of a {}-token row (0, 1 or all)", row.logit_rows, n);
  if (row.greedy_only && row.logit_rows != 1) fail("cuda engine: a greedy-only row needs one logit row");
  row_tokens_ = 0, window_offset_ = 0;
  if (row.as_decode) {
    decode_rows(*session_, row, window_offset_);
    row_tokens_ = n;
    return;
  }
  std::vector<float>* hidden = row.want_hidden ? &row.hidden : nullptr;
  if (row.greedy_only) {
    if (n == 1 && !hidden) {  // the token chosen on the device
      row.greedy = session_->decode_greedy(row.tokens[0]);
      row.logits.clear();
      return;
    }
    row.greedy = sample::greedy(session_->prefill(row.tokens, false, hidden));
    return;
  }
  row.logits = session_->prefill(row.tokens, row.logit_rows > 1, hidden);
  if (row.logit_rows == 0) row.logits.clear();
}

std::string CudaModel::activity() const {
  const ExpertStats s = session_->expert_stats();
  if (s.resident == s.total) return fmt::format("experts: all {} in VRAM", s.total);
  return fmt::format("experts: {} of {} in VRAM, hit rate {:.1f}%, {:.2f} GB over PCIe (decode {:.2f}, prompts {:.2f}), "
                     "{} swaps",
                     s.resident, s.total, 100.0 * s.hit_rate(), double(s.decode_miss_bytes + s.prompt_miss_bytes) / 1e9,
                     double(s.decode_miss_bytes) / 1e9, double(s.prompt_miss_bytes) / 1e9, s.swaps) +
         (s.cpu_experts ? fmt::format("; the CPU computed {} decode misses ({:.2f} GB from host RAM, {:.0f}% of them "
                                      "read ahead on a hint) in {:.2f} s",
                                      s.cpu_experts, double(s.cpu_expert_bytes) / 1e9,
                                      100.0 * double(s.cpu_hinted_experts) / double(s.cpu_experts), s.cpu_seconds)
                        : std::string());
}

}  // namespace lode::cuda
