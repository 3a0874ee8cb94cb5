// The MTP drafter on the GPU (engine::Drafter): the session's MTP block (CudaSession::mtp_append,
// mtp_draft_rows) follows the tokens the sequence commits and drafts after the pending one, as the CPU's
// drafter does (cpu/mtp.h): a row pairs the main model's final-normed hidden state before a token
// with the token, at the token's rotary position; its K/V rows, in its sequence's own cache of the
// block, are dense from the first position followed. What it drafts never changes the output, only
// how many tokens a verify step accepts.
#pragma once
#include <cstdint>
#include <optional>
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

  // Drafts armed in the verify step (CudaSession::WindowDrafts). A window whose drafts this drafter
  // drafted last can have the block run over its rows in its own verify step: arming(window) says
  // with what (none where it cannot: other drafts, no room, a session that cannot), armed() takes
  // that step's greedy tokens and drafts. Following the tokens it keeps then writes nothing (the
  // step wrote their rows), and the next draft() takes its first draft from the step, with no step
  // of its own and no wait, where the pending token is the step's greedy one there (always, for
  // greedy output); the drafts are the ones draft() would give otherwise. Where the last draft()
  // asked for more than one, the step continues to the second draft too (WindowDrafts::continues),
  // which the next draft() takes where the tokens followed are those greedy acceptance keeps.
  std::optional<CudaSession::WindowDrafts> arming(std::span<const int32_t> window);
  void armed(std::span<const int32_t> greedy, std::span<const int32_t> drafts, int32_t continued = -1);
  int64_t armed_drafts() const { return armed_drafts_; }          // first drafts taken from verify steps
  int64_t continued_drafts() const { return continued_drafts_; }  // and second drafts

 private:
  // What the drafter may take from a verify step that armed drafts: the window (its tokens,
  // greedy tokens and drafts), the position it began at, the block's K/V row of its first token,
  // and the step's serial (CudaSession::armed_windows); the draft it continued to (-1: none) and
  // the tokens greedy acceptance keeps, after which it continued.
  struct Armed {
    int64_t at = 0, row = 0;
    std::vector<int32_t> window{}, greedy{}, drafts{};
    int64_t serial = 0;
    int32_t continued = -1;
    int64_t kept = 0;
  };
  // After following kept tokens of such a window: the next draft, for `pending` at position `at`,
  // from row `row` of the step (session serial: CudaSession::armed_windows); and the draft after
  // it (-1: none), from the step's row `second_row`.
  struct Ready {
    int32_t pending = 0, draft = 0;
    int64_t at = 0, row = 0, serial = 0;
    int32_t second = -1;
    int64_t second_row = 0;
  };
  // The last draft(): its pending token, the position it followed and its first K/V row (written),
  // asked without a minimum probability (which an armed draft cannot say: no logits come back),
  // and how many drafts it asked for.
  struct Drafted {
    int32_t pending = 0;
    int64_t at = 0, row = 0, wanted = 0;
  };
  bool takes_armed_rows(std::span<const int32_t> tokens) const;
  // Whether a draft for `ask` begins with the ready one (a lone drafter's, no minimum probability).
  bool ready_for(const engine::DraftAsk& ask) const;
  void forget_armed();
  // The rotary position of K/V row r is r + shift(): the first position followed with a state
  // before it is row 0.
  int64_t shift() const { return start_ + 1; }
  CudaSession& session_;
  int64_t sequence_;
  int64_t start_ = 0;               // the sequence's position when it began to follow
  int64_t seen_ = 0;                // tokens followed since
  int64_t rows_ = 0;                // K/V rows the block holds for them
  std::vector<float> last_hidden_;  // the main model's state at the last position followed
  std::optional<Drafted> drafted_;
  std::optional<Armed> armed_;
  std::optional<Ready> ready_;
  int64_t armed_drafts_ = 0, continued_drafts_ = 0;
};

}  // namespace lode::cuda
