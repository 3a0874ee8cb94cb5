// The Gated DeltaNet mixer of qwen35moe for a chunk of consecutive tokens: qkv/z/b/a projections,
// causal depthwise conv1d (with state) + SiLU, L2-normed q/k (q scaled by 1/sqrt(dk)), gates
// beta = sigmoid(b) and g = ssm_a * softplus(a + dt_bias), the delta-rule recurrence per value head
// in float32, gated RMSNorm with silu(z), output projection. Value heads are in GGUF slot order:
// slot s uses key head s % Hk.
//
// The recurrence runs either token by token (the recurrent form: decoding, and the exact
// reference) or `wy_chunk` tokens at a time in the chunked form (deltanet_head_chunk), which gives
// the same result up to rounding.
#pragma once
#include <cstdint>
#include <span>

#include "cpu/compute.h"
#include "cpu/state.h"
#include "model/weights.h"

namespace lode::cpu {

// Causal depthwise conv over time for one token: x[c] = silu(sum_k w[c][k] * x[c, t-K+1+k]), where
// the first K-1 inputs come from state [channels][K-1] (oldest first); then the state shifts by one.
void deltanet_conv_step(const float* w, float* state, float* x, int64_t channels, int64_t kernel);

// One token's delta-rule update of one value head: state S [dk][dv] (float32, updated in place),
// k and q [dk] (normed; q scaled), v [dv]; g is the log-decay, beta the write strength.
// Writes o [dv] = S^T q after the update.
void deltanet_head_step(float* s, const float* q, const float* k, const float* v, float g,
                        float beta, int64_t dk, int64_t dv, float* o);

// The same update for L consecutive tokens of one value head at once, in the chunked form: with
// G_t the cumulative log-decay inside the chunk and S0 the state before it,
//   d_t = beta_t (v_t - e^{G_t} S0^T k_t - sum_{i<t} e^{G_t - G_i} (k_i . k_t) d_i)   (forward
//         substitution of the unit lower-triangular system, the WY / UT-transform step)
//   o_t = e^{G_t} S0^T q_t + sum_{i<=t} e^{G_t - G_i} (k_i . q_t) d_i
//   S   = e^{G_L} S0 + sum_i e^{G_L - G_i} k_i d_i^T.
// Token t's q and k are at q + t * qk_stride, k + t * qk_stride; v at v + t * v_stride; output at
// o + t * o_stride; g and beta are [L].
void deltanet_head_chunk(float* s, const float* q, const float* k, int64_t qk_stride,
                         const float* v, int64_t v_stride, const float* g, const float* beta,
                         int64_t L, int64_t dk, int64_t dv, float* o, int64_t o_stride);

// x: [n_tokens, hidden], already RMS-normed. Updates `state` and writes out [n_tokens, hidden].
// wy_chunk <= 1: recurrent form; otherwise the chunked form, wy_chunk tokens at a time.
// before_each (recurrent form only; empty, or one per token but the first): before_each[t - 1]
// receives the state before token t, so that a verify window can be cut back to any of its tokens
// after its first (Session::cut_window).
void deltanet_forward(const model::DeltaNetWeights& w, const model::Qwen35MoeConfig& config,
                      DeltaNetState& state, const float* x, float* out, int64_t n_tokens,
                      const Compute& compute, int64_t wy_chunk = 0, std::span<DeltaNetState> before_each = {});

}  // namespace lode::cpu
