// The Gated DeltaNet mixer of qwen35moe for a chunk of consecutive tokens: qkv/z/b/a projections,
// causal depthwise conv1d (with state) + SiLU, L2-normed q/k (q scaled by 1/sqrt(dk)), gates
// beta = sigmoid(b) and g = ssm_a * softplus(a + dt_bias), the delta-rule recurrence per value head
// in float32, gated RMSNorm with silu(z), output projection. Value heads are in GGUF slot order:
// slot s uses key head s % Hk.
//
// The chunk runs through the recurrent form token by token, so chunked prefill equals decoding
// exactly. Future work: the chunked WY / UT-transform form (chunk 64) for long prompts.
#pragma once
#include <cstdint>

#include "cpu/state.h"
#include "cpu/weights.h"

namespace lode::cpu {

// One token's delta-rule update of one value head: state S [dk][dv] (float32, updated in place),
// k and q [dk] (normed; q scaled), v [dv]; g is the log-decay, beta the write strength.
// Writes o [dv] = S^T q after the update.
void deltanet_head_step(float* s, const float* q, const float* k, const float* v, float g,
                        float beta, int64_t dk, int64_t dv, float* o);

// x: [n_tokens, hidden], already RMS-normed. Updates `state` and writes out [n_tokens, hidden].
void deltanet_forward(const DeltaNetWeights& w, const model::Qwen35MoeConfig& config,
                      DeltaNetState& state, const float* x, float* out, int64_t n_tokens,
                      int threads);

}  // namespace lode::cpu
