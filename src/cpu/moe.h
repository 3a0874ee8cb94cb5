// The mixture-of-experts feed-forward of qwen35moe for a chunk of tokens: router softmax over all
// experts (float32), top-k, weights renormalised to sum 1, each chosen expert
// down(silu(gate(x)) * up(x)), plus the shared expert scaled by sigmoid(ffn_gate_inp_shexp . x).
#pragma once
#include <cstdint>
#include <vector>

#include "cpu/compute.h"
#include "model/weights.h"

namespace lode::cpu {

struct Route {
  std::vector<int32_t> experts;  // chosen experts, most probable first (ties: lower index first)
  std::vector<float> weights;    // their renormalised probabilities, summing to 1
};

// Picks the top k of one token's router logits [n_experts].
Route route(const float* logits, int64_t n_experts, int64_t k);

// x: [n_tokens, hidden], already RMS-normed; writes out [n_tokens, hidden].
void moe_forward(const model::MoeWeights& w, const model::Qwen35MoeConfig& config, const float* x,
                 float* out, int64_t n_tokens, const Compute& compute);

}  // namespace lode::cpu
