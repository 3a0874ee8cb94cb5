#include "cpu/engine.h"

#include <thread>

#include <fmt/format.h>

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

// The MTP drafter behind engine::Drafter. Its K/V cache is int8 (one fp16 scale per 64 values),
// a quarter of fp32's bytes; the sequence's own format where int8 cannot hold the head size.
class CpuDrafter final : public engine::Drafter {
 public:
  CpuDrafter(const Session& session)
      : drafter_(session.weights(), *session.weights()->mtp, drafter_format(session),
                 {.threads = session.options().threads, .activations = session.options().activations}) {}
  void advance(std::span<const int32_t> tokens, std::span<const float> hidden) override {
    drafter_.advance(tokens, hidden);
  }
  std::vector<int32_t> draft(int32_t pending, int64_t n, float min_p) override {
    return drafter_.draft(pending, n, min_p);
  }
  void reset() override { drafter_.reset(); }
  int64_t rows() const override { return drafter_.rows(); }
  std::string describe() const override {
    return fmt::format("MTP drafter on the CPU, its K/V cache {}", kv::to_string(drafter_.kv_format()));
  }

 private:
  static kv::Format drafter_format(const Session& session) {
    const int64_t head_dim = session.config().head_dim;
    return kv::unsupported_reason(kv::Format::k8v8, head_dim).empty() ? kv::Format::k8v8 : session.kv_format();
  }
  MtpDrafter drafter_;
};

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
    if (drafter_) drafter_->reset();
  }
  engine::Drafter& drafter() override {
    if (!drafter_) {
      if (!session_.weights()->mtp) fail("--mtp: {}", session_.weights()->mtp_unavailable);
      drafter_ = std::make_unique<CpuDrafter>(session_);
    }
    return *drafter_;
  }
  std::shared_ptr<const engine::Checkpoint> checkpoint() const override {
    return std::make_shared<CpuCheckpoint>(session_.checkpoint());
  }
  void rewind(const engine::Checkpoint& checkpoint) override { session_.rewind(cpu_checkpoint(checkpoint)); }
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
  std::unique_ptr<CpuDrafter> drafter_;
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
  for (engine::StepRow& row : rows)
    entries.push_back({.session = &cpu_sequence(row.sequence).session(), .tokens = row.tokens,
                       .logit_rows = row.logit_rows, .want_hidden = row.want_hidden, .as_decode = row.as_decode});
  // Session::forward_batch checks that the sessions share weights and options, and the rows.
  Session::forward_batch(entries);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].logits = std::move(entries[i].logits);
    rows[i].hidden = std::move(entries[i].hidden);
  }
}

engine::EngineInfo CpuModel::info() const {
  const int threads = options_.threads > 0 ? options_.threads : int(std::thread::hardware_concurrency());
  return {"cpu", threads, options_.kv_format};
}

std::unique_ptr<engine::Sequence> open_sequence(std::shared_ptr<const model::ModelWeights> weights,
                                                SessionOptions options) {
  return CpuModel::make(std::move(weights), options)->open_sequence();
}

std::unique_ptr<engine::Sequence> borrow_sequence(Session& session) {
  return std::make_unique<CpuSequence>(CpuModel::make(session.weights(), session.options()), session);
}

Session& session_of(engine::Sequence& sequence) { return cpu_sequence(&sequence).session(); }

}  // namespace lode::cpu
