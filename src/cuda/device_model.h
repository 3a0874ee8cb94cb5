// The model as the CUDA session holds it on the device: weight matrices as stored (read by
// cuda/matvec.h, or expanded by cuda/dequant.h for prompts) and the experts behind the expert
// tier's device-side tables (cuda/expert_tier.h), uploaded once; and apart from them, one
// sequence's state of each layer (its K/V cache, its DeltaNet states). Shared by the decode step
// (cuda/session.cpp) and the prompt pass (cuda/prompt_pass.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/quant/types.h"
#include "cuda/kv_format.h"

namespace lode::cuda {

// A weight matrix on the device: the stored bytes, read by cuda::matvec.
struct DeviceMatrix {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;
};

// The experts of one projection of one layer: their pointers in a device-side table (each at its
// VRAM slot, or at its pinned host bytes, read over PCIe).
struct DeviceExperts {
  GgmlType type = GgmlType::F32;
  const void* const* table = nullptr;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;
};

// Where a layer's routing is counted (device memory; null counts: not counted): each chosen expert
// adds one to counts[expert], and one to *misses when resident[expert] is 0.
struct RouteTally {
  unsigned* counts = nullptr;        // [n_experts]
  const uint8_t* resident = nullptr;  // [n_experts]
  unsigned* misses = nullptr;
};

// One layer's weights; pointers are device memory.
struct DeviceLayer {
  bool recurrent = false;
  const float *attn_norm = nullptr, *post_norm = nullptr;
  DeviceMatrix q, k, v, o;                          // attention
  const float *q_norm = nullptr, *k_norm = nullptr;
  DeviceMatrix qkv, z, b, alpha, out;               // DeltaNet
  const float *conv = nullptr, *dt_bias = nullptr, *a = nullptr, *norm = nullptr;
  DeviceMatrix router, shared_gate, shared_up, shared_down, shared_logit;  // MoE
  DeviceMatrix router_and_shared_logit;  // router rows then the shared gate row, when both are float32
  // The mixer's input products for one token (q, k, v; or qkv, z, b, alpha), stacked: consecutive
  // matrices of the same type and width share one buffer, so one launch covers them (the matrices
  // above are views into it); their outputs are consecutive in the step's scratch.
  DeviceMatrix mixer_in[4];
  int n_mixer_in = 0;
  DeviceExperts gate, up, down;
  DeviceExperts gate_up;          // gate then up experts in one table, when they share type and shape
  DeviceExperts shared_gate_up;   // the shared expert's gate and up as a two-entry table, likewise
  RouteTally tally;               // this layer's routing counters
};

// One layer's state (device memory): one sequence's, or as the decode step reads it, every
// sequence's (the K/V view's row_sequence set, the DeltaNet states of sequence 0, the others after).
struct LayerState {
  KvView kv;                                        // attention: this layer's paged K/V cache
  float *conv_state = nullptr, *ssm_state = nullptr;  // DeltaNet: [channels][kernel - 1], [Hv][dk][dv]
  // A verify window's kept states (null without windows): [window rows - 1] of each, the states
  // before each of the window's tokens but its first (kernels::TokenRows::kept).
  float *conv_kept = nullptr, *ssm_kept = nullptr;
};

}  // namespace lode::cuda
