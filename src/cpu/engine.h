// The CPU engine behind engine/engine.h. A model is the weights bound once plus the session options
// its sequences share (Session::forward_batch runs sessions of one set of weights and options in
// one step); a sequence is a cpu::Session.
#pragma once
#include <memory>

#include "cpu/session.h"
#include "engine/engine.h"

namespace lode::cpu {

class CpuModel final : public engine::Model {
 public:
  static std::shared_ptr<CpuModel> make(std::shared_ptr<const model::ModelWeights> weights, SessionOptions options = {});

  const model::Qwen35MoeConfig& config() const override { return weights_->config; }
  std::unique_ptr<engine::Sequence> open_sequence() override;
  void step(std::span<engine::StepRow> rows) override;
  engine::EngineInfo info() const override;
  // The CPU's drafters draft together, a step of the MTP block over a row of each a draft
  // (MtpDrafter::draft_together).
  std::vector<std::vector<int32_t>> draft_together(std::span<const engine::DraftAsk> asks) override;

  const std::shared_ptr<const model::ModelWeights>& weights() const { return weights_; }
  const SessionOptions& options() const { return options_; }

  // Use make().
  CpuModel(std::shared_ptr<const model::ModelWeights> weights, SessionOptions options);

 private:
  std::shared_ptr<const model::ModelWeights> weights_;
  SessionOptions options_;
};

// One sequence on a CPU model of its own, of these weights and options (commands and tests that
// run one text).
std::unique_ptr<engine::Sequence> open_sequence(std::shared_ptr<const model::ModelWeights> weights,
                                                SessionOptions options = {});
// A sequence over a session the caller keeps (its model made for it from the session's weights and
// options); the session must outlive it.
std::unique_ptr<engine::Sequence> borrow_sequence(Session& session);

}  // namespace lode::cpu
