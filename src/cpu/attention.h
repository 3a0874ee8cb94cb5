// The gated full-attention mixer of qwen35moe for a chunk of consecutive tokens: q|gate projection,
// per-head q/k RMSNorm, partial NeoX RoPE, causal GQA softmax attention over the K/V cache,
// sigmoid output gate, output projection.
#pragma once
#include <cstdint>

#include "cpu/compute.h"
#include "cpu/state.h"
#include "model/weights.h"

namespace lode::cpu {

// x: [n_tokens, hidden], already RMS-normed; tokens are at positions pos0 .. pos0+n_tokens-1 and
// the cache holds exactly positions [0, pos0). Appends the chunk's keys/values to the cache and
// writes the mixer's output to out [n_tokens, hidden]. rope_shift moves the rotary positions only
// (the MTP block's cache starts at the sequence's position 1: rope_shift 1).
void attention_forward(const model::AttentionWeights& w, const model::Qwen35MoeConfig& config,
                       KvCache& cache, const float* x, float* out, int64_t n_tokens, int64_t pos0,
                       const Compute& compute, int64_t rope_shift = 0);
// The same chunk's keys and values appended to the cache, and nothing else (what a layer whose
// output is not needed leaves behind: the MTP drafter following committed tokens).
void attention_append_kv(const model::AttentionWeights& w, const model::Qwen35MoeConfig& config, KvCache& cache,
                         const float* x, int64_t n_tokens, int64_t pos0, const Compute& compute, int64_t rope_shift);

}  // namespace lode::cpu
