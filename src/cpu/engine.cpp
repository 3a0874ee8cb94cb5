#include "cpu/engine.h"

#include "core/error.h"
#include "cpu/mtp.h"

namespace lode::cpu {
namespace {

struct CpuCheckpoint final : engine::Checkpoint {
  explicit CpuCheckpoint(SequenceCheckpoint c) : held(std::move(c)) {}
  int64_t position() const override { return held.position; }
  int64_t bytes() const override { return held.bytes(); }
  SequenceCheckpoint held;
};

const SequenceCheckpoint& cpu_checkpoint(const engine::Checkpoint& checkpoint) {
  const auto* c = dynamic_cast<const CpuCheckpoint*>(&checkpoint);
  if (!c) fail("cpu engine: the checkpoint was taken by another backend");
  return c->held;
}

class CpuSequence final : public engine::Sequence {
 public:
  CpuSequence(std::shared_ptr<CpuModel> model, std::unique_ptr<Session> owned)
      : model_(std::move(model)), owned_(std::move(owned)), session_(*owned_) {}
  CpuSequence(std::shared_ptr<CpuModel> model, Session& borrowed) : model_(std::move(model)), session_(borrowed) {}

  engine::Model& model() const override { return *model_; }
  int64_t position() const override { return session_.position(); }
  int64_t max_context() const override { return session_.max_context(); }
  int64_t kv_bytes() const override { return session_.kv_bytes(); }
  void reset() override {
    session_.reset();
    if (drafter_) drafter_->reset(0);
  }
  engine::Drafter& drafter() override {
    if (!drafter_) {
      const SessionOptions& o = session_.options();
      drafter_ = std::make_unique<MtpDrafter>(session_.weights(), o.kv_format,
                                              Compute{.threads = o.threads, .activations = o.activations});
    }
    return *drafter_;
  }
  std::shared_ptr<const engine::Checkpoint> checkpoint() const override {
    return std::make_shared<CpuCheckpoint>(session_.checkpoint());
  }
  void rewind(const engine::Checkpoint& checkpoint) override { session_.rewind(cpu_checkpoint(checkpoint)); }
  bool cuts_windows() const override { return true; }
  void cut_window(int64_t tokens) override { session_.cut_window(tokens); }
  void copy_prefix(const engine::Sequence& other, const engine::Checkpoint& checkpoint) override {
    const auto* from = dynamic_cast<const CpuSequence*>(&other);
    if (!from) fail("cpu engine: cannot copy a prefix from another backend's sequence");
    session_.copy_prefix(from->session_, cpu_checkpoint(checkpoint));
  }

  Session& session() const { return session_; }

 private:
  std::shared_ptr<CpuModel> model_;
  std::unique_ptr<Session> owned_;
  Session& session_;
  std::unique_ptr<MtpDrafter> drafter_;
};

CpuSequence& cpu_sequence(engine::Sequence* sequence) {
  auto* s = dynamic_cast<CpuSequence*>(sequence);
  if (!s) fail("cpu engine: a step row names no sequence, or another backend's");
  return *s;
}

}  // namespace

CpuModel::CpuModel(std::shared_ptr<const model::ModelWeights> weights, SessionOptions options)
    : weights_(std::move(weights)), options_(options) {}

std::shared_ptr<CpuModel> CpuModel::make(std::shared_ptr<const model::ModelWeights> weights, SessionOptions options) {
  return std::make_shared<CpuModel>(std::move(weights), options);
}

std::unique_ptr<engine::Sequence> CpuModel::open_sequence() {
  auto self = std::static_pointer_cast<CpuModel>(shared_from_this());
  return std::make_unique<CpuSequence>(std::move(self), std::make_unique<Session>(weights_, options_));
}

void CpuModel::step(std::span<engine::StepRow> rows) {
  std::vector<BatchEntry> entries;
  entries.reserve(rows.size());
  for (engine::StepRow& row : rows) {
    if (row.sequence && &row.sequence->model() != this) fail("cpu engine: a step row names another model's sequence");
    if (row.greedy_only && row.logit_rows == 0) fail("cpu engine: a greedy-only row needs a logit row");
    if (row.top_only && (row.logit_rows != 1 || row.greedy_only))
      fail("cpu engine: a top-only row needs one logit row, and is not greedy-only");
    entries.push_back({.session = &cpu_sequence(row.sequence).session(), .tokens = row.tokens,
                       .logit_rows = row.logit_rows, .want_hidden = row.want_hidden, .as_decode = row.as_decode});
  }
  // Session::forward_batch checks that the sessions share weights and options, and the rows.
  Session::forward_batch(entries);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].logits = std::move(entries[i].logits);
    rows[i].hidden = std::move(entries[i].hidden);
    if (rows[i].greedy_only) {
      engine::greedy_from_logits(rows[i]);
    } else if (rows[i].top_only) {
      engine::top_from_logits(rows[i]);
    }
  }
}

std::vector<std::vector<int32_t>> CpuModel::draft_together(std::span<const engine::DraftAsk> asks) {
  const std::vector<MtpDrafter*> drafters = engine::drafters_as<MtpDrafter>(asks);
  if (drafters.size() != asks.size()) return engine::Model::draft_together(asks);  // (another kind of drafter)
  return MtpDrafter::draft_together(drafters, asks);
}

engine::EngineInfo CpuModel::info() const {
  return {.backend = "cpu", .threads = Compute{.threads = options_.threads}.resolved_threads(),
          .kv_format = options_.kv_format, .gpus = {}};
}

std::unique_ptr<engine::Sequence> open_sequence(std::shared_ptr<const model::ModelWeights> weights,
                                                SessionOptions options) {
  return CpuModel::make(std::move(weights), options)->open_sequence();
}

std::unique_ptr<engine::Sequence> borrow_sequence(Session& session) {
  return std::make_unique<CpuSequence>(CpuModel::make(session.weights(), session.options()), session);
}

}  // namespace lode::cpu
