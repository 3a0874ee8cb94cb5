// The MTP block's forward on the CPU (model/weights.h: MtpWeights), and the drafter built on it
// (engine::Drafter). A row of the block pairs the main model's final-normed hidden state at
// position p-1 with the token at p, at rotary position p; its attention layer keeps a K/V cache of
// its own, one row per position it has followed.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cpu/compute.h"
#include "cpu/kv_cache.h"
#include "engine/engine.h"
#include "model/weights.h"

namespace lode::cpu {

// The block's attention K/V rows for n rows after the cache's, the first at rotary position
// first_position: hidden [n][hidden] (the state before each token), tokens [n]; nothing else (rows
// that will never be drafted from: the tokens a drafter follows).
void mtp_append(const model::ModelWeights& main, const model::MtpWeights& w, KvCache& cache, const float* hidden,
                const int32_t* tokens, int64_t n, int64_t first_position, const Compute& compute);

// The block's forward for one row of each of several caches at once (drafts of one or several
// sequences: the block's matrices and the lm head read once for all of them): row t pairs hidden
// row t ([n][hidden]) with tokens[t] at rotary position positions[t] over caches[t] (its K/V row
// added). Writes the block's output, shared_head_norm(u), to out [n][hidden] (what the lm head
// reads and what the next draft pairs with its token), every row's logits to logits [n][vocab].
void mtp_forward_rows(const model::ModelWeights& main, const model::MtpWeights& w, std::span<KvCache* const> caches,
                      const float* hidden, const int32_t* tokens, const int64_t* positions, const Compute& compute,
                      float* out, float* logits);

class MtpDrafter final : public engine::Drafter {
 public:
  // The weights must hold an MTP block. Its K/V cache is int8 (one fp16 scale per 64 values), a
  // quarter of fp32's bytes; `fallback` where int8 cannot hold the head size.
  MtpDrafter(std::shared_ptr<const model::ModelWeights> weights, kv::Format fallback, Compute compute);
  void advance(std::span<const int32_t> tokens, std::span<const float> hidden) override;
  std::vector<int32_t> draft(int32_t pending, int64_t n, float min_p) override;
  void reset(int64_t position) override;
  int64_t followed() const override { return start_ + seen_; }
  std::string describe() const override;
  // Drafts for several drafters of one model at once (CpuModel::draft_together; draft() is this
  // for one), in steps of the block over a row of each that still drafts (mtp_forward_rows); each
  // drafter's drafts are the tokens its row alone gives: drafters[i] is asks[i]'s.
  static std::vector<std::vector<int32_t>> draft_together(std::span<MtpDrafter* const> drafters,
                                                          std::span<const engine::DraftAsk> asks);

 private:
  std::shared_ptr<const model::ModelWeights> weights_;
  Compute compute_;
  KvCache cache_;
  int64_t start_ = 0;               // the sequence's position when it began to follow
  int64_t seen_ = 0;                // tokens followed since
  std::vector<float> last_hidden_;  // the main model's state at the last position followed
};

}  // namespace lode::cpu
