// The qwen35moe weights of a GGUF model bound for an engine (the CPU forward pass, the GPU's upload): per layer, a view of every
// matrix (type + pointer into the read-only mapping + shape) and float32 copies of the small vectors
// (norms, conv taps, ssm_a, dt bias, shared-expert gate), which are F32 in every published file but
// are converted here whatever their type. Shapes are checked against the config when binding.
// Views point into the gguf::Reader's mapping: the Reader must outlive the weights.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/reader.h"
#include "model/matrix_view.h"
#include "model/qwen35moe.h"

namespace lode::model {

// A stack of same-shape matrices, one per expert (ggml ne = [cols, rows, n_experts]); a fused
// gate|up tensor is two stacks over the same bytes, the second starting `rows` rows later.
struct ExpertStack {
  MatrixView first;           // expert 0
  size_t expert_stride = 0;   // bytes from one expert's matrix to the next
  int64_t n_experts = 0;

  MatrixView expert(int64_t e) const {
    MatrixView m = first;
    m.data += size_t(e) * expert_stride;
    return m;
  }
};

struct AttentionWeights {
  MatrixView q;                 // attn_q      (hidden -> heads * 2 * head_dim), q|gate per head
  MatrixView k;                 // attn_k      (hidden -> kv_heads * head_dim)
  MatrixView v;                 // attn_v      (hidden -> kv_heads * head_dim)
  MatrixView output;            // attn_output (heads * head_dim -> hidden)
  std::vector<float> q_norm;    // attn_q_norm [head_dim], +1 folded
  std::vector<float> k_norm;    // attn_k_norm [head_dim], +1 folded
};

// Value heads in GGUF slot order (slot s uses key head s % Hk).
struct DeltaNetWeights {
  MatrixView qkv;               // attn_qkv  (hidden -> 2 * Hk * dk + Hv * dv), [Q | K | V]
  MatrixView gate;              // attn_gate (hidden -> Hv * dv), z
  MatrixView beta;              // ssm_beta  (hidden -> Hv), b
  MatrixView alpha;             // ssm_alpha (hidden -> Hv), a
  MatrixView out;               // ssm_out   (Hv * dv -> hidden)
  std::vector<float> conv;      // ssm_conv1d [channels][kernel]
  std::vector<float> dt_bias;   // ssm_dt.bias [Hv]
  std::vector<float> a;         // ssm_a [Hv] = -exp(A_log)
  std::vector<float> norm;      // ssm_norm [dv] (plain weight, no +1)
};

struct MoeWeights {
  MatrixView router;            // ffn_gate_inp (hidden -> n_experts)
  ExpertStack gate;             // ffn_gate_exps (hidden -> expert_ff) per expert
  ExpertStack up;               // ffn_up_exps   (hidden -> expert_ff) per expert
  ExpertStack down;             // ffn_down_exps (expert_ff -> hidden) per expert
  std::vector<float> shared_gate_inp;  // ffn_gate_inp_shexp [hidden]
  MatrixView shared_gate;       // ffn_gate_shexp (hidden -> shared_ff)
  MatrixView shared_up;         // ffn_up_shexp   (hidden -> shared_ff)
  MatrixView shared_down;       // ffn_down_shexp (shared_ff -> hidden)
};

struct LayerWeights {
  bool recurrent = false;                  // Gated DeltaNet (true) or full attention (false)
  std::vector<float> attn_norm;            // [hidden], +1 folded
  std::vector<float> post_attention_norm;  // [hidden], +1 folded
  AttentionWeights attention;              // bound when !recurrent
  DeltaNetWeights deltanet;                // bound when recurrent
  MoeWeights moe;
};

// The MTP block (GGUF block n_layers, `nextn.*`): from the main model's final-normed hidden state
// at position t and the token at t+1, u = eh_proj([enorm(embed(x)) | hnorm(h)]); then one full
// attention + MoE decoder layer of its own; its logits for t+2 are lm_head(shared_head_norm(u)).
struct MtpWeights {
  std::vector<float> enorm, hnorm, shared_head_norm;  // [hidden], +1 folded
  MatrixView eh_proj;                                 // (2 * hidden -> hidden), embedding half first
  LayerWeights layer;                                 // full attention + MoE
};

struct ModelWeights {
  Qwen35MoeConfig config;
  MatrixView token_embd;                   // [vocab rows of hidden]
  std::vector<float> output_norm;          // [hidden], +1 folded
  MatrixView output;                       // lm head (hidden -> vocab); token_embd when absent
  std::vector<LayerWeights> layers;        // main-model layers
  std::optional<MtpWeights> mtp;           // the first MTP block, when the file has one that binds
  std::string mtp_unavailable;             // else why not (bind_mtp_weights' message)
};

// Binds every main-model tensor; fails naming the tensor when one is missing or has the wrong
// shape or a type lode cannot read.
ModelWeights bind_weights(const gguf::Reader& reader, const Qwen35MoeConfig& config);
// Binds the first MTP block; fails saying so when the file has none (nextn_predict_layers 0), and
// naming the tensor when one is missing or wrong.
MtpWeights bind_mtp_weights(const gguf::Reader& reader, const Qwen35MoeConfig& config);

// Layers [first, end) of a model as a model of their own, for one GPU of several (cuda/pipeline.h):
// the config's n_layers and layer types cut to them; the embeddings, output norm and lm head kept
// (views; only the share with the last layer reads the head), the MTP block only with the last
// layer. Fails for an empty or out-of-range span.
ModelWeights layer_share(const ModelWeights& weights, int64_t first, int64_t end);

}  // namespace lode::model
