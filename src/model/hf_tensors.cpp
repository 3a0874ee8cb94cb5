#include "model/hf_tensors.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace lode::model {
namespace {

void add_one(std::vector<float>& v) {  // HF stores zero-centred norms; GGUF stores 1 + w
  for (float& x : v) x += 1.0f;
}

// Value heads from HF's grouped order to ggml's tiled order: GGUF slot s = r*Hk + k holds HF head
// j = k*(Hv/Hk) + r. Heads are blocks of `block` consecutive floats starting at `offset`.
void reorder_value_heads(std::vector<float>& v, size_t offset, int64_t hv, int64_t hk, size_t block) {
  const int64_t per_key = hv / hk;
  const std::vector<float> original(v.begin() + long(offset), v.begin() + long(offset + size_t(hv) * block));
  for (int64_t r = 0; r < per_key; ++r)
    for (int64_t k = 0; k < hk; ++k) {
      const size_t slot = size_t(r * hk + k), head = size_t(k * per_key + r);
      std::copy_n(original.begin() + long(head * block), block, v.begin() + long(offset + slot * block));
    }
}

}  // namespace

HfTensorSource::HfTensorSource(const SafetensorsCheckpoint& checkpoint, const Qwen35MoeConfig& config)
    : ckpt_(checkpoint), config_(config) {
  for (const char* p : {"model.language_model.", "model."})
    if (ckpt_.find(std::string(p) + "embed_tokens.weight")) {
      prefix_ = p;
      return;
    }
  fail("the checkpoint has no embed_tokens.weight under model. or model.language_model.: "
       "is this a qwen3_5_moe checkpoint?");
}

const SafeTensor& HfTensorSource::find(const std::string& name) const {
  if (const SafeTensor* t = ckpt_.find(name)) return *t;
  fail("the checkpoint lacks tensor '{}'", name);
}

const SafeTensor* HfTensorSource::find_any(std::initializer_list<std::string> names) const {
  for (const auto& n : names)
    if (const SafeTensor* t = ckpt_.find(n)) return t;
  return nullptr;
}

std::vector<float> HfTensorSource::load(const std::string& name) const {
  return SafetensorsCheckpoint::to_float(find(name));
}

std::string HfTensorSource::hf_layer(int64_t block) const {
  if (block < config_.n_layers) return prefix_ + "layers." + std::to_string(block) + ".";
  const std::string mtp = "mtp.layers." + std::to_string(block - config_.n_layers) + ".";
  if (ckpt_.find(mtp + "input_layernorm.weight")) return mtp;
  return prefix_ + mtp;
}

// Stacked experts [E, rows, cols] (ggml ne [cols, rows, E]) for gate / up / down.
std::vector<float> HfTensorSource::experts(int64_t block, const std::string& which) const {
  const std::string base = hf_layer(block) + "mlp.experts.";
  const int64_t n = config_.n_experts, ff = config_.expert_ff, h = config_.hidden;
  if (ckpt_.find(base + "0." + which + "_proj.weight")) {  // one tensor per expert
    std::vector<float> out;
    out.reserve(size_t(n * ff * h));
    for (int64_t e = 0; e < n; ++e) {
      const auto one = load(base + std::to_string(e) + "." + which + "_proj.weight");
      out.insert(out.end(), one.begin(), one.end());
    }
    return out;
  }
  if (which == "down") {  // fused down_proj [E, H, I]
    const SafeTensor* t = find_any({base + "down_proj", base + "down_proj.weight"});
    if (!t) fail("the checkpoint has neither {}0.down_proj.weight nor a fused {}down_proj", base, base);
    return SafetensorsCheckpoint::to_float(*t);
  }
  // fused gate_up_proj [E, 2I, H]: per expert the first I rows are gate, the next I up
  const SafeTensor* t = find_any({base + "gate_up_proj", base + "gate_up_proj.weight"});
  if (!t) fail("the checkpoint has neither {}0.{}_proj.weight nor a fused {}gate_up_proj", base, which, base);
  const auto fused = SafetensorsCheckpoint::to_float(*t);
  const size_t per = size_t(ff * h), skip = which == "up" ? per : 0;
  std::vector<float> out(size_t(n) * per);
  for (int64_t e = 0; e < n; ++e)
    std::copy_n(fused.begin() + long(size_t(e) * 2 * per + skip), per, out.begin() + long(size_t(e) * per));
  return out;
}

std::vector<float> HfTensorSource::delta_net(const TensorSpec& spec, const std::string& layer) const {
  const std::string base = layer + "linear_attn.";
  const int64_t hv = config_.ssm_dt_rank, hk = config_.ssm_groups, dv = config_.ssm_state;
  const size_t h = size_t(config_.hidden), v_offset = size_t(config_.ssm_key_dim() * 2);
  std::vector<float> v;
  switch (spec.role) {
    case TensorRole::ssm_qkv:  // rows [Q | K | V]: reorder the V rows
      v = load(base + "in_proj_qkv.weight");
      reorder_value_heads(v, v_offset * h, hv, hk, size_t(dv) * h);
      return v;
    case TensorRole::ssm_gate:
      v = load(base + "in_proj_z.weight");
      reorder_value_heads(v, 0, hv, hk, size_t(dv) * h);
      return v;
    case TensorRole::ssm_beta:
    case TensorRole::ssm_alpha:
      v = load(base + (spec.role == TensorRole::ssm_beta ? "in_proj_b.weight" : "in_proj_a.weight"));
      reorder_value_heads(v, 0, hv, hk, h);
      return v;
    case TensorRole::ssm_conv:  // [C, 1, K] squeezed to [C, K]; V channels reordered
      v = load(base + "conv1d.weight");
      reorder_value_heads(v, v_offset * size_t(config_.ssm_conv_kernel), hv, hk,
                          size_t(dv * config_.ssm_conv_kernel));
      return v;
    case TensorRole::ssm_dt:
      v = load(base + "dt_bias");
      reorder_value_heads(v, 0, hv, hk, 1);
      return v;
    case TensorRole::ssm_a:  // stored as -exp(A_log)
      v = load(base + "A_log");
      for (float& x : v) x = -std::exp(x);
      reorder_value_heads(v, 0, hv, hk, 1);
      return v;
    case TensorRole::ssm_out: {  // [H, Hv*dv]: reorder the input columns of every row
      v = load(base + "out_proj.weight");
      const size_t row = size_t(hv * dv);
      for (size_t r = 0; r < h; ++r) reorder_value_heads(v, r * row, hv, hk, size_t(dv));
      return v;
    }
    case TensorRole::norm:  // the gated output norm: ones-initialised, no +1
      return load(base + "norm.weight");
    default: fail("{}: not a DeltaNet tensor", spec.name);
  }
}

std::vector<float> HfTensorSource::block_tensor(const TensorSpec& spec, const std::string& base) const {
  const std::string layer = hf_layer(spec.block);
  auto norm = [&](const std::string& name) {
    auto v = load(name);
    add_one(v);
    return v;
  };
  if (base == "attn_norm.weight") return norm(layer + "input_layernorm.weight");
  if (base == "post_attention_norm.weight") return norm(layer + "post_attention_layernorm.weight");
  if (base == "attn_q.weight") return load(layer + "self_attn.q_proj.weight");
  if (base == "attn_k.weight") return load(layer + "self_attn.k_proj.weight");
  if (base == "attn_v.weight") return load(layer + "self_attn.v_proj.weight");
  if (base == "attn_output.weight") return load(layer + "self_attn.o_proj.weight");
  if (base == "attn_q_norm.weight") return norm(layer + "self_attn.q_norm.weight");
  if (base == "attn_k_norm.weight") return norm(layer + "self_attn.k_norm.weight");
  if (base == "ffn_gate_inp.weight") return load(layer + "mlp.gate.weight");
  if (base == "ffn_gate_exps.weight") return experts(spec.block, "gate");
  if (base == "ffn_up_exps.weight") return experts(spec.block, "up");
  if (base == "ffn_down_exps.weight") return experts(spec.block, "down");
  if (base == "ffn_gate_inp_shexp.weight") return load(layer + "mlp.shared_expert_gate.weight");
  if (base == "ffn_gate_shexp.weight") return load(layer + "mlp.shared_expert.gate_proj.weight");
  if (base == "ffn_up_shexp.weight") return load(layer + "mlp.shared_expert.up_proj.weight");
  if (base == "ffn_down_shexp.weight") return load(layer + "mlp.shared_expert.down_proj.weight");
  const std::string mtp = layer.substr(0, layer.find("layers."));  // "mtp." or "model.mtp."
  if (base == "nextn.eh_proj.weight") return load(mtp + "fc.weight");
  if (base == "nextn.enorm.weight") return norm(mtp + "pre_fc_norm_embedding.weight");
  if (base == "nextn.hnorm.weight") return norm(mtp + "pre_fc_norm_hidden.weight");
  if (base == "nextn.shared_head_norm.weight") return norm(mtp + "norm.weight");
  return delta_net(spec, layer);
}

std::vector<float> HfTensorSource::tensor(const TensorSpec& spec) const {
  std::vector<float> v;
  if (spec.name == "token_embd.weight") {
    v = load(prefix_ + "embed_tokens.weight");
  } else if (spec.name == "output_norm.weight") {
    v = load(prefix_ + "norm.weight");
    add_one(v);
  } else if (spec.name == "output.weight") {
    v = ckpt_.find("lm_head.weight") ? load("lm_head.weight") : load(prefix_ + "embed_tokens.weight");
  } else {
    const std::string prefix = "blk." + std::to_string(spec.block) + ".";
    v = block_tensor(spec, spec.name.substr(prefix.size()));
  }
  int64_t count = 1;
  for (int64_t d : spec.ne) count *= d;
  if (int64_t(v.size()) != count)
    fail("{}: the checkpoint's tensor has {} values, the config implies {}", spec.name, v.size(), count);
  return v;
}

}  // namespace lode::model
