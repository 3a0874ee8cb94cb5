// The qwen35moe model description (Qwen3.5 / Qwen3.6 MoE, llama.cpp's `qwen35moe`): every
// hyperparameter as read from / written to GGUF metadata, and every tensor of the model with its
// llama.cpp name and ggml-order shape. The contract is /work/shared/spec/qwen35moe.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/metadata.h"

namespace lode::model {

inline constexpr const char* kQwen35MoeArch = "qwen35moe";

struct Qwen35MoeConfig {
  int64_t hidden = 0;          // qwen35moe.embedding_length
  // Main-model layers, MTP excluded. GGUF qwen35moe.block_count = n_layers + n_mtp_layers.
  int64_t n_layers = 0;
  int64_t n_mtp_layers = 0;    // qwen35moe.nextn_predict_layers (0: no MTP block); blocks
                               // n_layers .. n_layers+n_mtp_layers-1 are MTP blocks
  int64_t n_heads = 0;         // qwen35moe.attention.head_count
  int64_t n_kv_heads = 0;      // qwen35moe.attention.head_count_kv
  int64_t head_dim = 0;        // qwen35moe.attention.key_length (== attention.value_length)
  int64_t rope_dims = 0;       // qwen35moe.rope.dimension_count (rotated dims per head, 64)
  double rope_theta = 0;       // qwen35moe.rope.freq_base
  std::vector<int32_t> rope_sections;  // qwen35moe.rope.dimension_sections (4 entries, [11,11,10,0])
  double rms_eps = 0;          // qwen35moe.attention.layer_norm_rms_epsilon
  int64_t n_experts = 0;       // qwen35moe.expert_count
  int64_t n_experts_used = 0;  // qwen35moe.expert_used_count
  int64_t expert_ff = 0;       // qwen35moe.expert_feed_forward_length
  int64_t shared_ff = 0;       // qwen35moe.expert_shared_feed_forward_length
  int64_t ssm_conv_kernel = 0; // qwen35moe.ssm.conv_kernel (4)
  int64_t ssm_state = 0;       // qwen35moe.ssm.state_size: dk = dv of the DeltaNet heads
  int64_t ssm_groups = 0;      // qwen35moe.ssm.group_count: Hk, DeltaNet key heads
  int64_t ssm_dt_rank = 0;     // qwen35moe.ssm.time_step_rank: Hv, DeltaNet value heads
  int64_t ssm_inner = 0;       // qwen35moe.ssm.inner_size: Hv * dv
  int64_t vocab = 0;           // length of tokenizer.ggml.tokens (lode writes no vocab_size key)
  int64_t context_length = 0;  // qwen35moe.context_length
  // Per main-model layer: true = Gated DeltaNet, false = full attention. From
  // qwen35moe.attention.recurrent_layers (BOOL array, per block) when present, else from
  // qwen35moe.full_attention_interval (layer i is full attention iff (i+1) % interval == 0).
  // MTP blocks are full attention, not listed here.
  std::vector<bool> is_recurrent;

  int64_t n_blocks() const { return n_layers + n_mtp_layers; }  // GGUF block_count
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t ssm_key_dim() const { return ssm_groups * ssm_state; }        // Hk * dk
  int64_t ssm_value_dim() const { return ssm_dt_rank * ssm_state; }     // Hv * dv
  int64_t conv_channels() const { return 2 * ssm_key_dim() + ssm_value_dim(); }
  bool block_is_recurrent(int64_t block) const {
    return block < n_layers && is_recurrent[size_t(block)];
  }
  int64_t n_full_attention_layers() const;
  // The interval that reproduces is_recurrent, or 0 when none does.
  int64_t full_attention_interval() const;
};

// Reads and validates the config: architecture qwen35moe, every required key present, sizes
// consistent (heads divisible by kv heads, Hv a multiple of Hk, inner == Hv*dv, rope dims <=
// head_dim, ...). Fails with a message naming the key.
Qwen35MoeConfig read_config(const gguf::Metadata& metadata);
// Checks the invariants read_config checks; fails naming the first one broken.
void validate_config(const Qwen35MoeConfig& config);
// Writes general.architecture and every qwen35moe.* key (not the tokenizer). Writes
// full_attention_interval, and attention.recurrent_layers too when no interval fits or the model
// has an MTP block (so the MTP block reads as full attention).
void write_config(const Qwen35MoeConfig& config, gguf::Metadata& metadata);

// What a tensor is, for per-tensor quantization recipes.
enum class TensorRole {
  embedding,         // token_embd
  output,            // output (lm_head)
  norm,              // every *norm weight (attn_norm, post_attention_norm, q/k norm, ssm_norm,
                     // output_norm, nextn norms)
  router,            // ffn_gate_inp
  expert_gate,       // ffn_gate_exps
  expert_up,         // ffn_up_exps
  expert_down,       // ffn_down_exps
  shared_gate_inp,   // ffn_gate_inp_shexp (sigmoid gate of the shared expert, a vector)
  shared_gate,       // ffn_gate_shexp
  shared_up,         // ffn_up_shexp
  shared_down,       // ffn_down_shexp
  attn_q,            // attn_q (q|gate interleaved per head)
  attn_k,            // attn_k
  attn_v,            // attn_v
  attn_output,       // attn_output
  ssm_qkv,           // attn_qkv of a DeltaNet block
  ssm_gate,          // attn_gate (z) of a DeltaNet block
  ssm_beta,          // ssm_beta
  ssm_alpha,         // ssm_alpha
  ssm_out,           // ssm_out
  ssm_conv,          // ssm_conv1d
  ssm_a,             // ssm_a (= -exp(A_log))
  ssm_dt,            // ssm_dt.bias
  mtp_eh_proj,       // nextn.eh_proj
};
const char* role_name(TensorRole role);

struct TensorSpec {
  std::string name;         // llama.cpp name: "blk.3.ffn_down_exps.weight"
  std::vector<int64_t> ne;  // ggml order: ne[0] = row length
  TensorRole role;
  int64_t block = -1;       // the block it belongs to; -1 for token_embd, output_norm, output
};

// Every tensor of the model, in file order (token_embd, then blocks, then output_norm, output).
std::vector<TensorSpec> tensor_specs(const Qwen35MoeConfig& config);

// Presets: the geometry of released models.
Qwen35MoeConfig qwen36_35b_a3b_config(bool with_mtp = true);

}  // namespace lode::model
