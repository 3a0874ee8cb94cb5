// The CUDA engine behind engine/engine.h. A model is one CudaSession: the weights, K/V cache and
// DeltaNet states of one sequence on the GPU, so it opens one sequence (the GPU's multi-sequence
// steps come with GPU serving, issue 18). Its checkpoints are the session's snapshots (K/V cells
// and DeltaNet states copied to host memory); a session with several step rows cuts verify
// windows instead, and one with the MTP block drafts on the GPU (cuda/mtp_drafter.h).
#pragma once
#include <memory>
#include <string>

#include "cuda/session.h"
#include "engine/engine.h"

namespace lode::cuda {

class CudaModel final : public engine::Model {
 public:
  explicit CudaModel(std::unique_ptr<CudaSession> session) : session_(std::move(session)) {}

  const model::Qwen35MoeConfig& config() const override { return session_->config(); }
  // The model's one sequence; fails when it is already open.
  std::unique_ptr<engine::Sequence> open_sequence() override;
  // One row: the GPU runs one sequence. A one-token row is a decode step; longer rows go through
  // the prompt pass in its own chunks, or, computed as decode steps (as_decode: a verify window,
  // with hidden states if wanted), through verify windows of up to the session's step_rows tokens.
  void step(std::span<engine::StepRow> rows) override;
  bool chunks_prompts() const override { return true; }
  engine::EngineInfo info() const override { return {"cuda", 0, session_->kv_format()}; }
  // "experts: 4719 of 10240 in VRAM, hit rate 54.9%, 1.2 GB over PCIe (decode 0.9, prompts 0.3), 1008 swaps".
  std::string activity() const override;

  CudaSession& session() { return *session_; }

 private:
  friend class CudaSequence;
  std::unique_ptr<CudaSession> session_;
  bool sequence_open_ = false;
  // The last step's row, when it was computed as decode steps: its tokens, and where its last
  // window began (what CudaSequence::cut_window can cut); 0 after other steps.
  int64_t row_tokens_ = 0, window_offset_ = 0;
};

}  // namespace lode::cuda
