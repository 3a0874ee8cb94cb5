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

namespace {

// The block's rows before its attention: [enorm(embed(token)) | hnorm(hidden)] of each through
// eh_proj into x [n][hidden], and x attention-normed into normed.
void block_input(const model::ModelWeights& main, const model::MtpWeights& w, const float* hidden,
                 const int32_t* tokens, int64_t n, const Compute& compute, float* x, float* normed) {
  const model::Qwen35MoeConfig& c = main.config;
  const int64_t h = c.hidden;
  const float eps = float(c.rms_eps);
  std::vector<float> both(size_t(n * 2 * h));
  for (int64_t t = 0; t < n; ++t) {
    float* row = both.data() + t * 2 * h;
    model::dequantize_row(main.token_embd, tokens[t], row);
    rms_norm(row, w.enorm.data(), row, h, eps);
    rms_norm(hidden + t * h, w.hnorm.data(), row + h, h, eps);
  }
  matmul(w.eh_proj, both.data(), x, n, compute);
  for (int64_t t = 0; t < n; ++t) rms_norm(x + t * h, w.layer.attn_norm.data(), normed + t * h, h, eps);
}

// The block's rows after its attention (mixed): the residual, the MoE and its residual (x is
// changed), shared_head_norm into out [n][hidden].
void block_output(const model::ModelWeights& main, const model::MtpWeights& w, float* x, const float* mixed,
                  int64_t n, const Compute& compute, float* out) {
  const model::Qwen35MoeConfig& c = main.config;
  const int64_t h = c.hidden, values = n * h;
  const float eps = float(c.rms_eps);
  const size_t count = static_cast<size_t>(values);
  std::vector<float> normed(count), moe(count);
  for (int64_t i = 0; i < values; ++i) x[i] += mixed[i];
  for (int64_t t = 0; t < n; ++t) rms_norm(x + t * h, w.layer.post_attention_norm.data(), normed.data() + t * h, h, eps);
  moe_forward(w.layer.moe, c, normed.data(), moe.data(), n, compute);
  for (int64_t i = 0; i < values; ++i) x[i] += moe[size_t(i)];
  for (int64_t t = 0; t < n; ++t) rms_norm(x + t * h, w.shared_head_norm.data(), out + t * h, h, eps);
}

}  // namespace

void mtp_append(const model::ModelWeights& main, const model::MtpWeights& w, KvCache& cache, const float* hidden,
                const int32_t* tokens, int64_t n, int64_t first_position, const Compute& compute) {
  const int64_t h = main.config.hidden;
  std::vector<float> x(size_t(n * h)), normed(x.size());
  block_input(main, w, hidden, tokens, n, compute, x.data(), normed.data());
  const int64_t held = cache.positions();
  attention_append_kv(w.layer.attention, main.config, cache, normed.data(), n, held, compute, first_position - held);
}

void mtp_forward_rows(const model::ModelWeights& main, const model::MtpWeights& w, std::span<KvCache* const> caches,
                      const float* hidden, const int32_t* tokens, const int64_t* positions, const Compute& compute,
                      float* out, float* logits) {
  const model::Qwen35MoeConfig& c = main.config;
  const int64_t h = c.hidden, n = int64_t(caches.size());
  std::vector<float> x(size_t(n * h)), normed(x.size()), mixed(x.size());
  block_input(main, w, hidden, tokens, n, compute, x.data(), normed.data());
  for (int64_t t = 0; t < n; ++t) {
    KvCache& cache = *caches[size_t(t)];
    const int64_t held = cache.positions();
    attention_forward(w.layer.attention, c, cache, normed.data() + t * h, mixed.data() + t * h, 1, held, compute,
                      positions[t] - held);
  }
  block_output(main, w, x.data(), mixed.data(), n, compute, out);
  matmul(main.output, out, logits, n, compute);
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
    mtp_append(*weights_, *weights_->mtp, cache_, rows.before.data(), rows.tokens.data(), int64_t(rows.tokens.size()),
               rows.first, compute_);
  last_hidden_.assign(hidden.end() - h, hidden.end());
  seen_ += n;
}

std::vector<std::vector<int32_t>> MtpDrafter::draft_together(std::span<MtpDrafter* const> drafters,
                                                             std::span<const engine::DraftAsk> asks) {
  std::vector<std::vector<int32_t>> drafts(drafters.size());
  // The drafters still drafting.
  std::vector<size_t> live = engine::drafting(drafters, asks, [](const MtpDrafter& d) { return !d.last_hidden_.empty(); });
  if (live.empty()) return drafts;
  const MtpDrafter& first = *drafters[live.front()];
  const model::ModelWeights& weights = *first.weights_;
  const int64_t h = weights.config.hidden, vocab = weights.config.vocab;
  // Each one's drafts' rows go again whatever happens: advance() adds the committed ones.
  struct KeepRows {
    std::vector<std::pair<KvCache*, int64_t>> held;
    ~KeepRows() {
      for (auto& [cache, positions] : held) cache->truncate(positions);
    }
  } keep;
  std::vector<int32_t> token(drafters.size());
  std::vector<std::vector<float>> state(drafters.size());
  for (const size_t i : live) {
    if (drafters[i]->weights_ != first.weights_) fail("cpu drafter: drafts together for drafters of one model only");
    keep.held.emplace_back(&drafters[i]->cache_, drafters[i]->cache_.positions());
    token[i] = asks[i].pending, state[i] = drafters[i]->last_hidden_;
  }
  for (int64_t step = 0; !live.empty(); ++step) {
    const int64_t rows = int64_t(live.size());
    std::vector<KvCache*> caches;
    std::vector<float> hidden(size_t(rows * h)), out(size_t(rows * h)), logits(size_t(rows * vocab));
    std::vector<int32_t> tokens;
    std::vector<int64_t> positions;
    for (int64_t t = 0; t < rows; ++t) {
      MtpDrafter& d = *drafters[live[size_t(t)]];
      caches.push_back(&d.cache_), tokens.push_back(token[live[size_t(t)]]);
      positions.push_back(d.followed() + step);
      std::copy(state[live[size_t(t)]].begin(), state[live[size_t(t)]].end(), hidden.begin() + t * h);
    }
    mtp_forward_rows(weights, *weights.mtp, caches, hidden.data(), tokens.data(), positions.data(), first.compute_,
                     out.data(), logits.data());
    std::vector<size_t> going;
    for (int64_t t = 0; t < rows; ++t) {
      const size_t i = live[size_t(t)];
      const std::span<const float> row(logits.data() + t * vocab, size_t(vocab));
      const int32_t best = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
      if (asks[i].min_p > 0 && sample::probability_of(row, best) < double(asks[i].min_p)) continue;  // (as draft())
      drafts[i].push_back(best);
      token[i] = best, state[i].assign(out.begin() + t * h, out.begin() + (t + 1) * h);
      if (int64_t(drafts[i].size()) < asks[i].n) going.push_back(i);
    }
    live = std::move(going);
  }
  return drafts;
}

std::vector<int32_t> MtpDrafter::draft(int32_t pending, int64_t n, float min_p) {
  MtpDrafter* self = this;
  const engine::DraftAsk ask{this, pending, n, min_p};
  return draft_together(std::span(&self, 1), std::span(&ask, 1)).front();
}

}  // namespace lode::cpu
