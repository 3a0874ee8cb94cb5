// The MTP drafter on the GPU (engine::Drafter): the session's MTP block (CudaSession::mtp_append,
// mtp_draft_rows) follows the tokens the sequence commits and drafts after the pending one, as the CPU's
// drafter does (cpu/mtp.h): a row pairs the main model's final-normed hidden state before a token
// with the token, at the token's rotary position; its K/V rows, in its sequence's own cache of the
// block, are dense from the first position followed. What it drafts never changes the output, only
// how many tokens a verify step accepts.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cuda/session.h"
#include "engine/engine.h"

namespace lode::cuda {

class GpuDrafter final : public engine::Drafter {
 public:
  // The session must hold the MTP block (CudaSessionOptions::mtp); drafts for its current sequence
  // (whichever the session works on later).
  explicit GpuDrafter(CudaSession& session);
  void advance(std::span<const int32_t> tokens, std::span<const float> hidden) override;
  std::vector<int32_t> draft(int32_t pending, int64_t n, float min_p) override;
  void reset(int64_t position) override;
  int64_t followed() const override { return start_ + seen_; }
  std::string describe() const override;
  // Drafts for several drafters of one session at once (CudaModel::draft_together): a step of the
  // block over one row of each a draft (CudaSession::mtp_draft_rows), so its weights and the lm
  // head are read once for all of them (draft() is this for one); each drafter's drafts are the
  // tokens its row alone gives. drafters[i] is asks[i]'s.
  static std::vector<std::vector<int32_t>> draft_together(std::span<GpuDrafter* const> drafters,
                                                          std::span<const engine::DraftAsk> asks);

 private:
  // The rotary position of K/V row r is r + shift(): the first position followed with a state
  // before it is row 0.
  int64_t shift() const { return start_ + 1; }
  CudaSession& session_;
  int64_t sequence_;
  int64_t start_ = 0;               // the sequence's position when it began to follow
  int64_t seen_ = 0;                // tokens followed since
  int64_t rows_ = 0;                // K/V rows the block holds for them
  std::vector<float> last_hidden_;  // the main model's state at the last position followed
};

}  // namespace lode::cuda
