// The CUDA engine behind engine/engine.h. A model is one CudaPipeline: a CudaSession, or one per
// share of the layers on several GPUs (cuda/pipeline.h), holding the weights and the K/V pages and
// DeltaNet states of the sequences (CudaSessionOptions::sequences), each an engine sequence; a
// step's one-token rows of several sequences run as one step. Its checkpoints are kept prefixes
// (K/V pages shared on the GPU, DeltaNet states copied to host memory); a session with several
// step rows cuts verify windows, and one with the MTP block drafts on the GPU (cuda/mtp_drafter.h;
// on the last GPU where the layers are spread).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cuda/kv_format.h"
#include "cuda/pipeline.h"
#include "cuda/session.h"
#include "engine/engine.h"

namespace lode::cuda {

class CudaSequence;

class CudaModel final : public engine::Model {
 public:
  explicit CudaModel(std::unique_ptr<CudaSession> session);  // one GPU
  explicit CudaModel(std::unique_ptr<CudaPipeline> pipeline);

  const model::Qwen35MoeConfig& config() const override { return pipeline_->config(); }
  // One of the session's sequences (CudaSessionOptions::sequences); fails when all are open.
  std::unique_ptr<engine::Sequence> open_sequence() override;
  // One-token rows of several sequences run in one step of the session (its step_rows at a time),
  // and with them the verify windows of other sequences (as_decode rows of at most window_rows
  // tokens; window_rows rows at a time in a step that holds one); prompt rows of several sequences
  // (several tokens, at most the last row's logits) in one pass of the prompt path while they fit
  // one (CudaSession::prefill_pieces), each with the bits it has alone. Any other row, and a row
  // with no other to join, runs alone: a longer row goes through the prompt pass in its own
  // chunks, or, computed as decode steps (as_decode: a verify window, with hidden states if
  // wanted), through verify windows of up to the session's window_rows tokens. Verify windows of
  // several sequences must fit one step (at most window_rows tokens together, each one that
  // joins), or the step fails before anything runs: each can be cut afterwards.
  void step(std::span<engine::StepRow> rows) override;
  bool chunks_prompts() const override { return true; }
  int64_t kv_pool_free_positions() const override {
    return pipeline_->kv_pool_positions() > 0 ? pipeline_->kv_free_pages() * kKvPagePositions : 0;
  }
  engine::EngineInfo info() const override {
    std::vector<int> gpus;
    for (size_t i = 0; i < pipeline_->shares(); ++i) gpus.push_back(pipeline_->device_of(i));
    return {"cuda", 0, pipeline_->kv_format(), pipeline_->kv_pool_positions(), kKvPagePositions, gpus};
  }
  // "experts: 4719 of 10240 in VRAM, hit rate 54.9%, 1.2 GB over PCIe (decode 0.9, prompts 0.3), 1008 swaps".
  std::string activity() const override;
  // The GPU's drafters draft together, one step of the MTP block over a row of each a draft
  // (GpuDrafter::draft_together).
  std::vector<std::vector<int32_t>> draft_together(std::span<const engine::DraftAsk> asks) override;

  CudaPipeline& pipeline() { return *pipeline_; }

  // How the steps so far ran their rows, counted (tests check that a path ran, not a fallback
  // that gives the same answers).
  struct Paths {
    int64_t alone = 0;          // rows through the session alone
    int64_t joined = 0;         // steps of one-token rows and verify windows of several sequences
    int64_t joined_windows = 0;  // of them, steps that held a window
    int64_t joined_top = 0;     // of them, steps whose top candidates were found on the device
    int64_t shared_passes = 0;  // prompt passes of several sequences' pieces
  };
  const Paths& paths() const { return paths_; }

 private:
  friend class CudaSequence;
  CudaSequence& sequence_of(const engine::StepRow& row) const;
  bool is_prompt_piece(const engine::StepRow& row) const;
  bool joins_rows(const engine::StepRow& row) const;
  void check_windows_fit(std::span<const engine::StepRow> rows) const;
  std::vector<std::vector<engine::StepRow*>> joined_steps(std::span<engine::StepRow* const> rows) const;
  std::vector<std::vector<engine::StepRow*>> prompt_passes(std::span<engine::StepRow* const> pieces) const;
  void step_pieces(std::span<engine::StepRow* const> rows);
  void step_alone(engine::StepRow& row);
  void step_joined(std::span<engine::StepRow* const> rows);

  std::unique_ptr<CudaPipeline> pipeline_;
  std::vector<bool> open_;  // per session sequence: whether a CudaSequence holds it
  Paths paths_;
};

}  // namespace lode::cuda
