#include "cpu/session.h"

#include <algorithm>

#include "core/error.h"
#include "cpu/attention.h"
#include "cpu/deltanet.h"
#include "cpu/moe.h"
#include "cpu/ops.h"

namespace lode::cpu {

Session::Session(const gguf::Reader& reader, const model::Qwen35MoeConfig& config,
                 SessionOptions options)
    : Session(std::make_shared<const ModelWeights>(bind_weights(reader, config)), options) {}

Session::Session(std::shared_ptr<const ModelWeights> weights, SessionOptions options)
    : weights_(std::move(weights)), options_(options), state_(weights_->config) {
  if (options_.max_context <= 0) options_.max_context = weights_->config.context_length;
  if (options_.max_context <= 0) fail("cpu session: the model declares no context length; pass a max_context");
}

void Session::reset() { state_ = SequenceState(weights_->config); }

SequenceCheckpoint Session::checkpoint() const { return {state_.position, state_.deltanet}; }

void Session::rewind(const SequenceCheckpoint& checkpoint) {
  if (checkpoint.position < 0 || checkpoint.position > state_.position)
    fail("cpu session: cannot rewind to position {}: the sequence holds {} positions",
         checkpoint.position, state_.position);
  if (checkpoint.deltanet.size() != state_.deltanet.size())
    fail("cpu session: the checkpoint has {} layers, this model {}", checkpoint.deltanet.size(),
         state_.deltanet.size());
  const model::Qwen35MoeConfig& c = weights_->config;
  const auto kept = size_t(checkpoint.position * c.n_kv_heads * c.head_dim);
  for (KvCache& cache : state_.kv) {
    if (cache.k.size() < kept) continue;  // a DeltaNet layer: no cache
    cache.k.resize(kept);
    cache.v.resize(kept);
  }
  state_.deltanet = checkpoint.deltanet;
  state_.position = checkpoint.position;
}

std::vector<float> Session::prefill(std::span<const int32_t> tokens, int64_t chunk,
                                    bool all_logits) {
  const int64_t n = int64_t(tokens.size());
  if (n == 0) fail("cpu session: prefill needs at least one token");
  for (int32_t token : tokens) {
    if (token < 0 || token >= vocab()) {
      fail("cpu session: token id {} is outside the vocabulary [0, {})", token, vocab());
    }
  }
  if (state_.position + n > options_.max_context) {
    fail("cpu session: {} tokens after {} would exceed the context of {} positions; raise --ctx",
         n, state_.position, options_.max_context);
  }
  if (chunk <= 0 || chunk > n) chunk = n;
  std::vector<float> logits;
  logits.reserve(size_t((all_logits ? n : 1) * vocab()));
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    const bool last_chunk = start + len == n;
    const int64_t rows = all_logits ? len : (last_chunk ? 1 : 0);
    forward_chunk(tokens.data() + start, len, rows, logits);
  }
  return logits;
}

std::vector<float> Session::decode(int32_t token) {
  return prefill(std::span<const int32_t>(&token, 1), 1, false);
}

void Session::forward_chunk(const int32_t* tokens, int64_t n, int64_t logit_rows,
                            std::vector<float>& logits) {
  const ModelWeights& w = *weights_;
  const model::Qwen35MoeConfig& c = w.config;
  const int64_t hidden = c.hidden;
  const Compute compute{.threads = options_.threads, .activations = options_.activations};
  const float eps = float(c.rms_eps);

  std::vector<float> h(size_t(n * hidden)), normed(h.size()), mixed(h.size());
  for (int64_t t = 0; t < n; ++t) dequantize_row(w.token_embd, tokens[t], h.data() + t * hidden);

  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    const LayerWeights& lw = w.layers[size_t(layer)];
    for (int64_t t = 0; t < n; ++t) {
      rms_norm(h.data() + t * hidden, lw.attn_norm.data(), normed.data() + t * hidden, hidden, eps);
    }
    if (lw.recurrent) {
      deltanet_forward(lw.deltanet, c, state_.deltanet[size_t(layer)], normed.data(), mixed.data(),
                       n, compute, n > 1 ? options_.deltanet_chunk : 0);
    } else {
      attention_forward(lw.attention, c, state_.kv[size_t(layer)], normed.data(), mixed.data(), n,
                        state_.position, compute);
    }
    for (size_t i = 0; i < h.size(); ++i) h[i] += mixed[i];
    for (int64_t t = 0; t < n; ++t) {
      rms_norm(h.data() + t * hidden, lw.post_attention_norm.data(), normed.data() + t * hidden,
               hidden, eps);
    }
    moe_forward(lw.moe, c, normed.data(), mixed.data(), n, compute);
    for (size_t i = 0; i < h.size(); ++i) h[i] += mixed[i];
  }
  state_.position += n;

  // The lm head only for the positions asked for: it is the largest matrix of the model.
  if (logit_rows == 0) return;
  const int64_t first = n - logit_rows;
  const int64_t rows = logit_rows;
  for (int64_t t = first; t < n; ++t) {
    rms_norm(h.data() + t * hidden, w.output_norm.data(), normed.data() + (t - first) * hidden,
             hidden, eps);
  }
  const size_t old = logits.size();
  logits.resize(old + size_t(rows * c.vocab));
  matmul(w.output, normed.data(), logits.data() + old, rows, compute);
}

}  // namespace lode::cpu
