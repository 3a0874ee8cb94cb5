// The MTP block's forward on the CPU (model/weights.h: MtpWeights), and a drafter built on it. A
// row of the block pairs the main model's final-normed hidden state at position p-1 with the token
// at p; its attention layer keeps a K/V cache of its own, one row per position from 1 on.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cpu/compute.h"
#include "cpu/kv_cache.h"
#include "model/weights.h"

namespace lode::cpu {

// n rows after the cache's: hidden [n][hidden] (the state before each token), tokens [n]. Writes the
// block's output, shared_head_norm(u), to out [n][hidden] (what the lm head reads and what the next
// draft pairs with its token), and the last row's logits to last_logits [vocab] when not null.
void mtp_forward(const model::ModelWeights& main, const model::MtpWeights& w, KvCache& cache, const float* hidden,
                 const int32_t* tokens, int64_t n, const Compute& compute, float* out, float* last_logits);

// Drafts for one sequence: it follows the main model's committed tokens (advance), and drafts
// greedily from there without changing what it holds (draft).
class MtpDrafter {
 public:
  MtpDrafter(std::shared_ptr<const model::ModelWeights> weights, const model::MtpWeights& mtp, kv::Format kv_format,
             Compute compute);
  // The main model took `tokens` at its next positions; hidden [tokens.size()][hidden] is its
  // final-normed hidden state after each.
  void advance(std::span<const int32_t> tokens, std::span<const float> hidden);
  // Up to n tokens after `pending` (sampled, not yet run by the main model), each the MTP block's
  // most likely token; stops early when that token's probability is below min_p. Empty before the
  // first advance.
  std::vector<int32_t> draft(int32_t pending, int64_t n, float min_p);
  void reset();
  int64_t rows() const { return cache_.positions(); }
  kv::Format kv_format() const { return cache_.format(); }

 private:
  std::shared_ptr<const model::ModelWeights> weights_;
  const model::MtpWeights& mtp_;
  Compute compute_;
  KvCache cache_;
  std::vector<float> last_hidden_;  // the main model's state at its last position (empty at 0)
};

}  // namespace lode::cpu
