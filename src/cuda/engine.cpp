#include "cuda/engine.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "cuda/mtp_drafter.h"
#include "sample/sampler.h"

namespace lode::cuda {
namespace {

// A prefix kept on the GPUs: its K/V pages shared with the sequences (cuda/kv_cache.h).
struct CudaCheckpoint final : engine::Checkpoint {
  explicit CudaCheckpoint(std::shared_ptr<const CudaPipeline::Prefix> p) : prefix(std::move(p)) {}
  int64_t position() const override { return prefix->positions(); }
  int64_t bytes() const override { return prefix->host_bytes(); }
  std::shared_ptr<const CudaPipeline::Prefix> prefix;
};

const CudaPipeline::Prefix& prefix_of(const engine::Checkpoint& checkpoint) {
  const auto* c = dynamic_cast<const CudaCheckpoint*>(&checkpoint);
  if (!c) fail("cuda engine: the checkpoint was taken by another backend");
  return *c->prefix;
}

}  // namespace

class CudaSequence final : public engine::Sequence {
 public:
  CudaSequence(std::shared_ptr<CudaModel> model, int64_t slot) : model_(std::move(model)), slot_(slot) {}
  ~CudaSequence() override {
    try {
      session().reset();  // its pages and its promise back to the pool
      session().reserve_kv(0);
    } catch (const std::exception&) {  // (a failing device fails the next call clearly)
    }
    model_->open_[size_t(slot_)] = false;
  }

  engine::Model& model() const override { return *model_; }
  int64_t position() const override { return session().position(); }
  int64_t max_context() const override { return session().max_context(); }
  int64_t kv_bytes() const override { return session().kv_bytes(); }
  void reset() override { session().reset(); }
  bool reserve(int64_t positions) override {
    return positions <= max_context() && session().reserve_kv(positions);
  }
  std::shared_ptr<const engine::Checkpoint> checkpoint() const override {
    return std::make_shared<CudaCheckpoint>(session().keep());
  }
  void rewind(const engine::Checkpoint& checkpoint) override {
    if (checkpoint.position() > position())
      fail("cuda engine: cannot rewind to position {}: the sequence holds {} positions", checkpoint.position(),
           position());
    session().resume(prefix_of(checkpoint));
  }
  // Any sequence's checkpoint of this model: its K/V pages shared with this one, its DeltaNet
  // states copied in.
  void copy_prefix(const engine::Sequence& other, const engine::Checkpoint& checkpoint) override {
    if (&other.model() != &model()) fail("cuda engine: cannot copy a prefix from another model's sequence");
    session().resume(prefix_of(checkpoint));
  }

  bool ready_steps(const engine::StepsAhead& ahead) override {
    using In = engine::StepsAhead::Output;
    using Out = CudaSession::StepsAhead::Output;
    const Out output = ahead.output == In::greedy ? Out::greedy : ahead.output == In::top ? Out::top : Out::logits;
    session().ready_steps({.window = ahead.tokens, .output = output, .drafts = ahead.drafts});
    return true;
  }
  bool cuts_windows() const override { return session().window_rows() > 1; }
  // Within the last window of the sequence's last row computed as decode steps (the session keeps
  // its states).
  void cut_window(int64_t tokens) override {
    if (tokens == row_tokens_) return;  // nothing to cut
    if (tokens <= window_offset_ || tokens > row_tokens_)
      fail("cuda engine: cannot cut a verify row of {} tokens to {}: the GPU keeps the states of its last window "
           "after its first token ({} to {})", row_tokens_, tokens, window_offset_ + 1, row_tokens_);
    session().cut_window(tokens - window_offset_);
    row_tokens_ = tokens;
  }

  // The GPU's MTP drafter, when the model holds the block (CudaSessionOptions::mtp; on the last GPU
  // where the layers are spread), on this sequence's cache of the block (cuda/mtp_drafter.h).
  engine::Drafter& drafter() override {
    if (!drafter_) drafter_ = std::make_unique<GpuDrafter>(session().drafting());
    return *drafter_;
  }
  // The drafts a verify row of this sequence can arm in its step (GpuDrafter::arming): a greedy
  // window, one step's worth, of the drafts its drafter drafted last, at the position it follows.
  GpuDrafter* arming_drafter(const engine::StepRow& row) const {
    const int64_t n = int64_t(row.tokens.size());
    const bool one_window = row.as_decode && row.greedy_only && row.logit_rows == n && n > 1 &&
                            n <= model_->pipeline_->window_rows();
    return one_window && drafter_ && drafter_->followed() == position() ? drafter_.get() : nullptr;
  }

  // The model's GPUs, working on this sequence.
  CudaPipeline& session() const {
    model_->pipeline_->use_sequence(slot_);
    return *model_->pipeline_;
  }
  int64_t slot() const { return slot_; }

  // The tokens of the last step's row when it was computed as decode steps, and where its last
  // window began (what cut_window can cut); 0 after other steps.
  int64_t row_tokens_ = 0, window_offset_ = 0;

 private:
  std::shared_ptr<CudaModel> model_;
  int64_t slot_;
  std::unique_ptr<GpuDrafter> drafter_;
};

CudaModel::CudaModel(std::unique_ptr<CudaSession> session)
    : CudaModel(std::make_unique<CudaPipeline>(std::move(session))) {}

CudaModel::CudaModel(std::unique_ptr<CudaPipeline> pipeline)
    : pipeline_(std::move(pipeline)), open_(size_t(pipeline_->sequences()), false) {}

std::vector<std::vector<int32_t>> CudaModel::draft_together(std::span<const engine::DraftAsk> asks) {
  const std::vector<GpuDrafter*> drafters = engine::drafters_as<GpuDrafter>(asks);
  if (drafters.size() != asks.size()) return engine::Model::draft_together(asks);  // (another backend's drafter)
  return GpuDrafter::draft_together(drafters, asks);
}

std::unique_ptr<engine::Sequence> CudaModel::open_sequence() {
  const auto free = std::find(open_.begin(), open_.end(), false);
  if (free == open_.end())
    fail("cuda engine: the GPU holds {} sequence(s), all open (the session's room: --parallel)", open_.size());
  auto sequence = std::make_unique<CudaSequence>(std::static_pointer_cast<CudaModel>(shared_from_this()),
                                                 int64_t(free - open_.begin()));
  sequence->reset();  // (what a closed sequence left there)
  *free = true;
  return sequence;
}

namespace {

// A row computed as decode steps compute it (StepRow::as_decode): windows of at most the session's
// window_rows tokens, each a one-step verify window; the last one's first token is at window_offset.
// With `drafter`, a row of one window that arms the drafter's drafts in its step.
void decode_rows(CudaPipeline& session, engine::StepRow& row, int64_t& window_offset, GpuDrafter* drafter) {
  const int64_t n = int64_t(row.tokens.size()), vocab = session.vocab(), hidden = session.config().hidden;
  const int64_t most = session.window_rows();
  const bool every_row = row.logit_rows == n;
  row.logits.clear(), row.hidden.clear(), row.greedy.clear();
  if (every_row && !row.greedy_only) row.logits.reserve(size_t(n * vocab));
  if (row.want_hidden) row.hidden.reserve(size_t(n * hidden));
  for (int64_t at = 0; at < n; at += most) {
    const auto tokens = row.tokens.subspan(size_t(at), size_t(std::min(most, n - at)));
    const bool last = at + int64_t(tokens.size()) == n, wanted = every_row || (last && row.logit_rows == 1);
    const bool greedy = row.greedy_only && wanted;
    window_offset = at;
    const std::optional<CudaSession::WindowDrafts> armed = drafter ? drafter->arming(tokens) : std::nullopt;
    CudaSession::Window w = session.decode_window(tokens, greedy, row.want_hidden, armed ? &*armed : nullptr);
    if (armed) drafter->armed(w.greedy, w.drafts, w.continued);
    if (wanted && greedy) {
      row.greedy.insert(row.greedy.end(), every_row ? w.greedy.begin() : w.greedy.end() - 1, w.greedy.end());
    } else if (wanted) {
      row.logits.insert(row.logits.end(), every_row ? w.logits.begin() : w.logits.end() - vocab, w.logits.end());
    }
    if (row.want_hidden) row.hidden.insert(row.hidden.end(), w.hidden.begin(), w.hidden.end());
  }
}

// Row r's top candidates from a step that found them on the device (kernels::top_candidates); a
// row with a NaN or +inf keeps finite -1 (its sampler fails, not the step).
sample::TopCandidates device_top(const CudaSession::Window& out, size_t r) {
  const int32_t finite = out.finite[r];
  if (finite < 0) return {.best = {}, .finite = -1};
  const auto first = out.top.begin() + long(r * sample::kTopCandidates);
  return {std::vector<sample::Scored>(first, first + std::min<long>(finite, sample::kTopCandidates)), finite,
          out.aside.at(r)};
}

// A joined step's answers for one StepRow whose tokens were the step's rows first.. (step_joined):
// every row's hidden state where the row wants them, and for each logit row (its last, or every
// one) the greedy token, top candidates or logits it asks for.
void take_rows(engine::StepRow& row, const CudaSession::Window& out, size_t first, bool greedy_only, bool top,
               size_t vocab, size_t width) {
  const size_t n = row.tokens.size();
  row.logits.clear(), row.hidden.clear(), row.greedy.clear();
  if (top) row.top = {};
  if (row.want_hidden && !out.hidden.empty())
    row.hidden.assign(out.hidden.begin() + long(first * width), out.hidden.begin() + long((first + n) * width));
  const size_t logit_rows = size_t(row.logit_rows);
  for (size_t r = first + n - logit_rows; r < first + n; ++r) {
    if (greedy_only) {
      row.greedy.push_back(out.greedy[r]);
    } else if (top) {
      sample::TopCandidates candidates = device_top(out, r);
      if (row.greedy_only) row.greedy.push_back(sample::greedy(candidates));
      else row.top = std::move(candidates);
    } else {
      const std::span<const float> logits(out.logits.data() + r * vocab, vocab);
      if (row.greedy_only) row.greedy.push_back(sample::greedy(logits));
      else row.logits.insert(row.logits.end(), logits.begin(), logits.end());
    }
  }
}

}  // namespace

CudaSequence& CudaModel::sequence_of(const engine::StepRow& row) const {
  auto* sequence = dynamic_cast<CudaSequence*>(row.sequence);
  if (!sequence || &sequence->model() != this) fail("cuda engine: a step row names no sequence of this model");
  return *sequence;
}

void CudaModel::step(std::span<engine::StepRow> rows) {
  std::vector<bool> seen(open_.size(), false);
  for (const engine::StepRow& row : rows) {
    const CudaSequence& sequence = sequence_of(row);
    if (seen[size_t(sequence.slot())]) fail("cuda engine: a sequence appears twice in one step");
    seen[size_t(sequence.slot())] = true;
    const int64_t n = int64_t(row.tokens.size());
    if (n == 0) fail("cuda engine: a step row without tokens");
    if (row.logit_rows < 0 || row.logit_rows > n || (row.logit_rows > 1 && row.logit_rows < n))
      fail("cuda engine: {} logit rows asked of a {}-token row (0, 1 or all)", row.logit_rows, n);
    if (row.greedy_only && row.logit_rows == 0) fail("cuda engine: a greedy-only row needs a logit row");
    if (row.top_only && (row.logit_rows != 1 || row.greedy_only))
      fail("cuda engine: a top-only row needs one logit row, and is not greedy-only");
    for (int32_t token : row.tokens)
      if (token < 0 || token >= pipeline_->vocab())
        fail("cuda engine: token id {} is outside the vocabulary [0, {})", token, pipeline_->vocab());
    if (sequence.position() + n > sequence.max_context())
      fail("cuda engine: {} tokens after {} do not fit the context of {} positions", n, sequence.position(),
           sequence.max_context());
  }
  check_windows_fit(rows);
  std::vector<engine::StepRow*> joined, pieces, alone;
  for (engine::StepRow& row : rows) {
    sequence_of(row).row_tokens_ = 0, sequence_of(row).window_offset_ = 0;
    (joins_rows(row) ? joined : is_prompt_piece(row) ? pieces : alone).push_back(&row);
  }
  // (One row alone takes the one-sequence path, unless it wants top candidates: those come from a
  // step of rows.)
  if (joined.size() == 1 && !joined.front()->top_only) alone.push_back(joined.front()), joined.clear();
  for (const std::vector<engine::StepRow*>& pass : prompt_passes(pieces))
    pass.size() > 1 ? step_pieces(pass) : step_alone(*pass.front());
  for (engine::StepRow* row : alone) step_alone(*row);
  for (const std::vector<engine::StepRow*>& step : joined_steps(joined)) step_joined(step);
  // Top-only rows whose path gave logits (all but a step of top-only and greedy-only rows): their
  // candidates taken on the host.
  for (engine::StepRow& row : rows)
    if (row.top_only && !row.logits.empty()) engine::top_from_logits(row);
}

// A step with verify windows (as_decode rows of several tokens) of several sequences runs them in
// one step of the session, which keeps the states before each of their tokens but the first for cut_window; one
// that cannot (each a window the session keeps states for, together at most window_rows tokens)
// fails before anything runs.
void CudaModel::check_windows_fit(std::span<const engine::StepRow> rows) const {
  int64_t windows = 0, tokens = 0;
  bool joinable = true;
  for (const engine::StepRow& row : rows)
    if (row.as_decode && row.tokens.size() > 1)
      ++windows, tokens += int64_t(row.tokens.size()), joinable = joinable && joins_rows(row);
  const int64_t most = std::min(pipeline_->window_rows(), pipeline_->step_rows());
  if (windows > 1 && (!joinable || tokens > most))
    fail("cuda engine: verify windows of {} sequences ({} tokens) in one step; the GPU keeps the states of at most "
         "{} rows a step (window_rows): run them in steps that fit",
         windows, tokens, most);
}

// Whether a row can share a step with other sequences' rows: one token and one logit row at most,
// or a verify window the session keeps states for (not asking for top candidates).
bool CudaModel::joins_rows(const engine::StepRow& row) const {
  const int64_t n = int64_t(row.tokens.size());
  if (n == 1) return row.logit_rows <= 1;
  return row.as_decode && !row.top_only && n <= pipeline_->window_rows() && pipeline_->window_rows() > 1;
}

// The joining rows cut into steps, the windows first, all in the first step (step() checked that
// they fit one: a step that keeps states writes over the kept states of any window before it), then
// one-token rows while their tokens fit step_rows, and window_rows in a step that holds a window.
std::vector<std::vector<engine::StepRow*>> CudaModel::joined_steps(std::span<engine::StepRow* const> rows) const {
  std::vector<engine::StepRow*> ordered(rows.begin(), rows.end());
  std::stable_partition(ordered.begin(), ordered.end(), [](const engine::StepRow* row) { return row->tokens.size() > 1; });
  std::vector<std::vector<engine::StepRow*>> steps;
  int64_t tokens = 0;
  bool windows = false;
  for (engine::StepRow* row : ordered) {
    const int64_t n = int64_t(row->tokens.size());
    const bool with = windows || n > 1;
    const int64_t most = with ? std::min(pipeline_->window_rows(), pipeline_->step_rows()) : pipeline_->step_rows();
    if (steps.empty() || tokens + n > most)
      steps.emplace_back(), tokens = 0, windows = false;
    steps.back().push_back(row);
    tokens += n, windows = windows || n > 1;
  }
  return steps;
}

// A row the prompt pass takes whole, beside other sequences' (CudaSession::prefill_pieces): several
// tokens, not decode steps, at most its last row's logits, within one pass.
bool CudaModel::is_prompt_piece(const engine::StepRow& row) const {
  const int64_t n = int64_t(row.tokens.size());
  return n > 1 && !row.as_decode && row.logit_rows <= 1 && pipeline_->pieces_fit(std::span(&n, 1));
}

// The prompt pieces cut into passes, in order: each pass takes pieces while they fit it.
std::vector<std::vector<engine::StepRow*>> CudaModel::prompt_passes(std::span<engine::StepRow* const> pieces) const {
  std::vector<std::vector<engine::StepRow*>> passes;
  std::vector<int64_t> lengths;
  for (engine::StepRow* row : pieces) {
    lengths.push_back(int64_t(row->tokens.size()));
    if (passes.empty() || !pipeline_->pieces_fit(lengths)) passes.emplace_back(), lengths = {lengths.back()};
    passes.back().push_back(row);
  }
  return passes;
}

// Prompt pieces of several sequences in one pass; a greedy-only row's token chosen on the host
// from its logits, as step_alone chooses it.
void CudaModel::step_pieces(std::span<engine::StepRow* const> rows) {
  std::vector<CudaSession::Piece> pieces;
  for (const engine::StepRow* row : rows)
    pieces.push_back({sequence_of(*row).slot(), row->tokens, row->logit_rows == 1, row->want_hidden});
  std::vector<CudaSession::PieceOutput> out = pipeline_->prefill_pieces(pieces);
  ++paths_.shared_passes;
  for (size_t r = 0; r < rows.size(); ++r) {
    engine::StepRow& row = *rows[r];
    row.logits = std::move(out[r].logits), row.hidden = std::move(out[r].hidden);
    if (row.greedy_only) engine::greedy_from_logits(row);
  }
}

// One row through the session alone: a decode step, the prompt pass, or verify windows.
void CudaModel::step_alone(engine::StepRow& row) {
  ++paths_.alone;
  CudaSequence& sequence = sequence_of(row);
  CudaPipeline& session = sequence.session();
  const int64_t n = int64_t(row.tokens.size());
  if (row.as_decode) {
    decode_rows(session, row, sequence.window_offset_, sequence.arming_drafter(row));
    sequence.row_tokens_ = n;
    return;
  }
  std::vector<float>* hidden = row.want_hidden ? &row.hidden : nullptr;
  if (row.greedy_only && n == 1 && !hidden) {  // the token chosen on the device
    row.greedy = {session.decode_greedy(row.tokens[0])};
    row.logits.clear();
    return;
  }
  row.logits = session.prefill(row.tokens, row.logit_rows > 1, hidden);
  if (row.logit_rows == 0) row.logits.clear();
  if (row.greedy_only) engine::greedy_from_logits(row);
}

// Rows of several sequences in one step of the session (CudaSession::decode_rows), a session row
// for each token (a verify window's consecutive): the greedy tokens chosen on the device when every
// row wants only that; the top candidates found there when every row wants those or greedy tokens
// (each logit row's best candidate); else every row's logits to the host (and a greedy-only or
// top-only row's answer taken there, by the same rules). A window keeps its states for cut_window.
void CudaModel::step_joined(std::span<engine::StepRow* const> rows) {
  std::vector<CudaSession::Row> tokens;
  bool greedy_only = true, top = true, want_hidden = false, windows = false;
  for (const engine::StepRow* row : rows) {
    for (int32_t token : row->tokens)
      tokens.push_back({sequence_of(*row).slot(), token, row->top_only ? row->top_aside : std::span<const int32_t>()});
    greedy_only = greedy_only && row->greedy_only && !row->want_hidden;
    top = top && (row->greedy_only || row->top_only);
    want_hidden = want_hidden || row->want_hidden;
    windows = windows || row->tokens.size() > 1;
  }
  if (!top || greedy_only)
    for (CudaSession::Row& row : tokens) row.aside = {};  // (the host sets them aside from the logits)
  CudaSession::Window out = pipeline_->decode_rows(tokens, greedy_only, want_hidden, top);
  ++paths_.joined, paths_.joined_top += top && !greedy_only, paths_.joined_windows += windows;
  size_t first = 0;  // the row's first session row
  for (engine::StepRow* row : rows) {
    const size_t n = row->tokens.size();
    take_rows(*row, out, first, greedy_only, top, size_t(pipeline_->vocab()), size_t(pipeline_->config().hidden));
    if (n > 1) sequence_of(*row).row_tokens_ = int64_t(n);  // (its window's first token at 0)
    first += n;
  }
}

std::string CudaModel::activity() const {
  const ExpertStats s = pipeline_->expert_stats();
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
