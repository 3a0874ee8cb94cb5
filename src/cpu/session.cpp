#include "cpu/session.h"

#include <algorithm>

#include "core/error.h"
#include "cpu/attention.h"
#include "cpu/deltanet.h"
#include "cpu/matmul.h"
#include "cpu/moe.h"
#include "cpu/ops.h"

namespace lode::cpu {

Session::Session(const gguf::Reader& reader, const model::Qwen35MoeConfig& config,
                 SessionOptions options)
    : Session(std::make_shared<const model::ModelWeights>(model::bind_weights(reader, config)), options) {}

Session::Session(std::shared_ptr<const model::ModelWeights> weights, SessionOptions options)
    : weights_(std::move(weights)), options_(options), state_(weights_->config, options.kv_format) {
  if (options_.max_context <= 0) options_.max_context = weights_->config.context_length;
  if (options_.max_context <= 0) fail("cpu session: the model declares no context length; pass a max_context");
}

void Session::reset() {
  state_ = SequenceState(weights_->config, options_.kv_format);
  window_.held = false;
}

int64_t Session::kv_bytes() const {
  int64_t total = 0;
  for (const KvCache& cache : state_.kv) total += cache.bytes();
  return total;
}

SequenceCheckpoint Session::checkpoint() const { return {state_.position, state_.deltanet}; }

void Session::rewind(const SequenceCheckpoint& checkpoint) {
  if (checkpoint.position < 0 || checkpoint.position > state_.position)
    fail("cpu session: cannot rewind to position {}: the sequence holds {} positions",
         checkpoint.position, state_.position);
  if (checkpoint.deltanet.size() != state_.deltanet.size())
    fail("cpu session: the checkpoint has {} layers, this model {}", checkpoint.deltanet.size(),
         state_.deltanet.size());
  for (KvCache& cache : state_.kv) cache.truncate(checkpoint.position);
  state_.deltanet = checkpoint.deltanet;
  state_.position = checkpoint.position;
  window_.held = false;
}

void Session::hold_window(int64_t tokens) {
  window_.held = tokens > 1;  // (a one-token step has nothing to cut)
  if (!window_.held) return;
  window_.start = state_.position, window_.tokens = tokens;
  window_.before.resize(state_.deltanet.size());
  for (size_t layer = 0; layer < state_.deltanet.size(); ++layer)
    if (!state_.deltanet[layer].s.empty()) window_.before[layer].resize(size_t(tokens - 1));
}

void Session::cut_window(int64_t tokens) {
  if (!window_.held) fail("cpu session: no verify window to cut: the last step was not several tokens run as decode steps");
  if (tokens < 1 || tokens > window_.tokens)
    fail("cpu session: cannot keep {} tokens of a window of {} (a cut keeps 1 to {})", tokens, window_.tokens,
         window_.tokens);
  if (tokens == window_.tokens) return;
  // The state before token `tokens` becomes the sequence's; what was there is not needed again
  // (a later cut keeps fewer tokens).
  for (size_t layer = 0; layer < window_.before.size(); ++layer)
    if (!window_.before[layer].empty())
      std::swap(state_.deltanet[layer], window_.before[layer][size_t(tokens - 1)]);
  state_.position = window_.start + tokens;
  for (KvCache& cache : state_.kv) cache.truncate(state_.position);
  window_.tokens = tokens;
}

void Session::copy_prefix(const Session& other, const SequenceCheckpoint& checkpoint) {
  if (other.weights_ != weights_) fail("cpu session: cannot copy a prefix from a session of other weights");
  if (checkpoint.position < 0 || checkpoint.position > other.state_.position)
    fail("cpu session: cannot copy {} positions from a sequence of {}", checkpoint.position, other.state_.position);
  if (checkpoint.position > options_.max_context)
    fail("cpu session: {} positions do not fit a context of {}", checkpoint.position, options_.max_context);
  if (other.options_.kv_format != options_.kv_format)
    fail("cpu session: cannot copy a prefix held as {} K/V into a session of {}", kv::to_string(other.options_.kv_format),
         kv::to_string(options_.kv_format));
  SequenceState copy(weights_->config, options_.kv_format);
  for (size_t layer = 0; layer < copy.kv.size(); ++layer)
    copy.kv[layer] = other.state_.kv[layer].prefix(checkpoint.position);
  copy.deltanet = checkpoint.deltanet;
  copy.position = checkpoint.position;
  state_ = std::move(copy);
  window_.held = false;
}

void Session::check_append(std::span<const int32_t> tokens) const {
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
}

std::vector<float> Session::prefill(std::span<const int32_t> tokens, int64_t chunk,
                                    bool all_logits) {
  check_append(tokens);
  const int64_t n = int64_t(tokens.size());
  if (chunk <= 0 || chunk > n) chunk = n;
  std::vector<float> logits;
  logits.reserve(size_t((all_logits ? n : 1) * vocab()));
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    const bool last_chunk = start + len == n;
    BatchEntry entry{this, tokens.subspan(size_t(start), size_t(len)), all_logits ? len : (last_chunk ? 1 : 0), {}};
    forward_batch(std::span(&entry, 1));
    logits.insert(logits.end(), entry.logits.begin(), entry.logits.end());
  }
  return logits;
}

std::vector<float> Session::decode(int32_t token) {
  return prefill(std::span<const int32_t>(&token, 1), 1, false);
}

void Session::forward_batch(std::span<BatchEntry> entries) {
  if (entries.empty()) return;
  const Session& first = *entries[0].session;
  const model::ModelWeights& w = *first.weights_;
  const model::Qwen35MoeConfig& c = w.config;
  const SessionOptions& options = first.options_;
  int64_t n = 0;  // rows of the whole batch
  for (const BatchEntry& e : entries) {
    if (e.session->weights_ != first.weights_ || e.session->options_.threads != options.threads ||
        e.session->options_.activations != options.activations ||
        e.session->options_.deltanet_chunk != options.deltanet_chunk)
      fail("cpu session: a batch needs sessions of the same weights and options");
    for (const BatchEntry& other : entries)
      if (&other != &e && other.session == e.session) fail("cpu session: a session appears twice in one batch");
    e.session->check_append(e.tokens);
    if (e.logit_rows < 0 || e.logit_rows > int64_t(e.tokens.size()))
      fail("cpu session: {} logit rows asked of a {}-token chunk", e.logit_rows, e.tokens.size());
    n += int64_t(e.tokens.size());
  }
  for (const BatchEntry& e : entries) e.session->hold_window(e.as_decode ? int64_t(e.tokens.size()) : 0);
  const int64_t hidden = c.hidden;
  const Compute compute{.threads = options.threads, .activations = options.activations};
  const float eps = float(c.rms_eps);

  std::vector<float> h(size_t(n * hidden)), normed(h.size()), mixed(h.size());
  int64_t row = 0;
  for (const BatchEntry& e : entries) {
    for (int32_t token : e.tokens) model::dequantize_row(w.token_embd, token, h.data() + row++ * hidden);
  }
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    const model::LayerWeights& lw = w.layers[size_t(layer)];
    for (int64_t t = 0; t < n; ++t) {
      rms_norm(h.data() + t * hidden, lw.attn_norm.data(), normed.data() + t * hidden, hidden, eps);
    }
    // The mixers hold per-sequence state: each sequence runs on its own rows.
    row = 0;
    for (BatchEntry& e : entries) {
      SequenceState& state = e.session->state_;
      const int64_t len = int64_t(e.tokens.size());
      const float* x = normed.data() + row * hidden;
      float* out = mixed.data() + row * hidden;
      if (lw.recurrent) {
        Window& window = e.session->window_;
        deltanet_forward(lw.deltanet, c, state.deltanet[size_t(layer)], x, out, len, compute,
                         len > 1 && !e.as_decode ? options.deltanet_chunk : 0,
                         window.held ? std::span(window.before[size_t(layer)]) : std::span<DeltaNetState>());
      } else {
        attention_forward(lw.attention, c, state.kv[size_t(layer)], x, out, len, state.position, compute);
      }
      row += len;
    }
    for (size_t i = 0; i < h.size(); ++i) h[i] += mixed[i];
    for (int64_t t = 0; t < n; ++t) {
      rms_norm(h.data() + t * hidden, lw.post_attention_norm.data(), normed.data() + t * hidden,
               hidden, eps);
    }
    moe_forward(lw.moe, c, normed.data(), mixed.data(), n, compute);
    for (size_t i = 0; i < h.size(); ++i) h[i] += mixed[i];
  }

  // The final-normed state of every row, for the entries that want it (the MTP block's input).
  row = 0;
  for (BatchEntry& e : entries) {
    const int64_t len = int64_t(e.tokens.size());
    if (e.want_hidden) {
      e.hidden.resize(size_t(len * hidden));
      for (int64_t t = 0; t < len; ++t)
        rms_norm(h.data() + (row + t) * hidden, w.output_norm.data(), e.hidden.data() + t * hidden, hidden, eps);
    }
    row += len;
  }
  // The lm head only for the rows asked for: it is the largest matrix of the model. A row whose
  // final-normed state was just written for the entry is copied, not normed twice.
  std::vector<std::pair<const float*, bool>> wanted;  // the row, and whether it is already normed
  row = 0;
  for (BatchEntry& e : entries) {
    const int64_t len = int64_t(e.tokens.size());
    e.session->state_.position += len;
    for (int64_t t = len - e.logit_rows; t < len; ++t)
      wanted.push_back(e.want_hidden ? std::pair(e.hidden.data() + t * hidden, true)
                                     : std::pair(h.data() + (row + t) * hidden, false));
    row += len;
  }
  const int64_t rows = int64_t(wanted.size());
  if (rows == 0) return;
  for (int64_t r = 0; r < rows; ++r) {
    const auto [from, done] = wanted[size_t(r)];
    if (done)
      std::copy(from, from + hidden, normed.data() + r * hidden);
    else
      rms_norm(from, w.output_norm.data(), normed.data() + r * hidden, hidden, eps);
  }
  std::vector<float> logits(size_t(rows * c.vocab));
  matmul(w.output, normed.data(), logits.data(), rows, compute);
  const float* next = logits.data();
  for (BatchEntry& e : entries) {
    e.logits.assign(next, next + e.logit_rows * c.vocab);
    next += e.logit_rows * c.vocab;
  }
}

}  // namespace lode::cpu
