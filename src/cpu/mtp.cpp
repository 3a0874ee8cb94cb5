#include "cpu/mtp.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "cpu/attention.h"
#include "cpu/matmul.h"
#include "cpu/moe.h"
#include "cpu/ops.h"
#include "sample/logprobs.h"
#include "sample/sampler.h"

namespace lode::cpu {

void mtp_forward(const model::ModelWeights& main, const model::MtpWeights& w, KvCache& cache, const float* hidden,
                 const int32_t* tokens, int64_t n, int64_t first_position, const Compute& compute, float* out,
                 float* last_logits) {
  const model::Qwen35MoeConfig& c = main.config;
  const int64_t h = c.hidden;
  const float eps = float(c.rms_eps);
  std::vector<float> both(size_t(n * 2 * h)), x(size_t(n * h)), normed(x.size()), mixed(x.size());
  for (int64_t t = 0; t < n; ++t) {
    float* row = both.data() + t * 2 * h;  // [enorm(embed(token)) | hnorm(hidden)]
    model::dequantize_row(main.token_embd, tokens[t], row);
    rms_norm(row, w.enorm.data(), row, h, eps);
    rms_norm(hidden + t * h, w.hnorm.data(), row + h, h, eps);
  }
  matmul(w.eh_proj, both.data(), x.data(), n, compute);
  for (int64_t t = 0; t < n; ++t) rms_norm(x.data() + t * h, w.layer.attn_norm.data(), normed.data() + t * h, h, eps);
  const int64_t held = cache.positions();
  if (!out) return attention_append_kv(w.layer.attention, c, cache, normed.data(), n, held, compute, first_position - held);
  attention_forward(w.layer.attention, c, cache, normed.data(), mixed.data(), n, held, compute, first_position - held);
  for (size_t i = 0; i < x.size(); ++i) x[i] += mixed[i];
  for (int64_t t = 0; t < n; ++t)
    rms_norm(x.data() + t * h, w.layer.post_attention_norm.data(), normed.data() + t * h, h, eps);
  moe_forward(w.layer.moe, c, normed.data(), mixed.data(), n, compute);
  for (size_t i = 0; i < x.size(); ++i) x[i] += mixed[i];
  for (int64_t t = 0; t < n; ++t) rms_norm(x.data() + t * h, w.shared_head_norm.data(), out + t * h, h, eps);
  if (last_logits) matmul(main.output, out + (n - 1) * h, last_logits, 1, compute);
}

MtpDrafter::MtpDrafter(std::shared_ptr<const model::ModelWeights> weights, kv::Format fallback, Compute compute)
    : weights_(std::move(weights)), compute_(compute),
      cache_(kv::mtp_format(weights_->config.head_dim, fallback), weights_->config.n_kv_heads, weights_->config.head_dim) {
  if (!weights_->mtp) fail("--mtp: {}", weights_->mtp_unavailable);
}

std::string MtpDrafter::describe() const {
  return fmt::format("MTP drafter on the CPU, its K/V cache {}", kv::to_string(cache_.format()));
}

void MtpDrafter::reset(int64_t position) {
  cache_.truncate(0);
  last_hidden_.clear();
  start_ = position;
  seen_ = 0;
}

void MtpDrafter::advance(std::span<const int32_t> tokens, std::span<const float> hidden) {
  const int64_t h = weights_->config.hidden, n = int64_t(tokens.size());
  const engine::FollowedRows rows = engine::followed_rows(tokens, hidden, last_hidden_, followed(), h);
  if (n == 0) return;
  if (!rows.tokens.empty())  // committed rows are never drafted from: their K/V is all that is needed
    mtp_forward(*weights_, *weights_->mtp, cache_, rows.before.data(), rows.tokens.data(), int64_t(rows.tokens.size()),
                rows.first, compute_, nullptr, nullptr);
  last_hidden_.assign(hidden.end() - h, hidden.end());
  seen_ += n;
}

std::vector<int32_t> MtpDrafter::draft(int32_t pending, int64_t n, float min_p) {
  std::vector<int32_t> drafts;
  if (last_hidden_.empty()) return drafts;
  // The drafts' rows go again whatever happens: advance() adds the committed ones.
  struct KeepRows {
    KvCache& cache;
    int64_t held;
    ~KeepRows() { cache.truncate(held); }
  } keep{cache_, cache_.positions()};
  const int64_t h = weights_->config.hidden;
  std::vector<float> state = last_hidden_;
  std::vector<float> out(static_cast<size_t>(h)), logits(static_cast<size_t>(weights_->config.vocab));
  int32_t token = pending;
  for (int64_t i = 0; i < n; ++i) {
    mtp_forward(*weights_, *weights_->mtp, cache_, state.data(), &token, 1, followed() + i, compute_, out.data(),
                logits.data());
    const auto best = std::max_element(logits.begin(), logits.end());
    token = int32_t(best - logits.begin());
    // The most likely token's probability, only where it can stop the drafts.
    if (min_p > 0 && sample::probability_of(logits, token) < double(min_p)) break;
    drafts.push_back(token);
    state = out;
  }
  return drafts;
}

}  // namespace lode::cpu
