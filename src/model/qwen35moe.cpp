#include "model/qwen35moe.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"

namespace lode::model {
namespace {

const std::string kPrefix = std::string(kQwen35MoeArch) + ".";

std::string key(const char* name) { return kPrefix + name; }

// A size of the model, 1 .. most. The bounds are far above any real model's and keep the products
// the memory plan forms within int64 (a block_count of 2^62 was allocated as layers before anything
// else was checked).
int64_t positive(const gguf::Metadata& m, const char* name, int64_t most) {
  const int64_t v = m.get_int64(key(name));
  if (v <= 0 || v > most)
    fail("{}: {} = {} is outside 1..{} (the file is not a valid qwen35moe model)", m.source(), key(name), v, most);
  return v;
}

// A float the model is computed with: finite and positive.
double positive_real(const gguf::Metadata& m, const char* name) {
  const double v = m.get_double(key(name));
  if (!(std::isfinite(v) && v > 0))
    fail("{}: {} = {} must be a finite positive number (the file is not a valid qwen35moe model)", m.source(),
         key(name), v);
  return v;
}

// is_recurrent from attention.recurrent_layers (per block; the MTP blocks' entries are ignored)
// or from full_attention_interval.
std::vector<bool> read_layer_kinds(const gguf::Metadata& m, int64_t n_layers) {
  std::vector<bool> kinds(size_t(n_layers), false);
  if (m.contains(key("attention.recurrent_layers"))) {
    const gguf::Array& a = m.get_array(key("attention.recurrent_layers"));
    if (a.element_type() == gguf::ValueType::Bool) {
      const auto& flags = a.values<bool>();
      if (int64_t(flags.size()) < n_layers)
        fail("{}: {} has {} entries, the model has {} layers", m.source(),
             key("attention.recurrent_layers"), flags.size(), n_layers);
      for (int64_t i = 0; i < n_layers; ++i) kinds[size_t(i)] = flags[size_t(i)];
    } else {
      const auto flags = m.get_integers(key("attention.recurrent_layers"));
      if (int64_t(flags.size()) < n_layers)
        fail("{}: {} has {} entries, the model has {} layers", m.source(),
             key("attention.recurrent_layers"), flags.size(), n_layers);
      for (int64_t i = 0; i < n_layers; ++i) kinds[size_t(i)] = flags[size_t(i)] != 0;
    }
    return kinds;
  }
  const int64_t interval = m.get_int64_or(key("full_attention_interval"), 4);
  if (interval <= 0)
    fail("{}: {} = {} must be positive", m.source(), key("full_attention_interval"), interval);
  for (int64_t i = 0; i < n_layers; ++i) kinds[size_t(i)] = (i + 1) % interval != 0;
  return kinds;
}

}  // namespace

int64_t Qwen35MoeConfig::n_full_attention_layers() const {
  int64_t n = 0;
  for (bool r : is_recurrent) n += r ? 0 : 1;
  return n;
}

int64_t Qwen35MoeConfig::full_attention_interval() const {
  for (int64_t interval = 1; interval <= n_layers; ++interval) {
    bool fits = true;
    for (int64_t i = 0; i < n_layers && fits; ++i)
      fits = is_recurrent[size_t(i)] == ((i + 1) % interval != 0);
    if (fits) return interval;
  }
  return 0;
}

void validate_config(const Qwen35MoeConfig& c) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) fail("qwen35moe config: {}", what);
  };
  need(c.hidden > 0 && c.n_layers > 0 && c.n_heads > 0 && c.n_kv_heads > 0 && c.head_dim > 0,
       "hidden, layers, heads, kv heads and head_dim must be positive");
  need(c.n_mtp_layers >= 0, "nextn_predict_layers must not be negative");
  need(c.n_heads % c.n_kv_heads == 0,
       fmt::format("head_count {} is not a multiple of head_count_kv {}", c.n_heads, c.n_kv_heads));
  need(c.rope_dims > 0 && c.rope_dims <= c.head_dim && c.rope_dims % 2 == 0,
       fmt::format("rope.dimension_count {} must be even and at most key_length {}", c.rope_dims,
                   c.head_dim));
  need(c.n_experts > 0 && c.n_experts_used > 0 && c.n_experts_used <= c.n_experts,
       fmt::format("expert_used_count {} must be in 1..expert_count {}", c.n_experts_used,
                   c.n_experts));
  need(c.expert_ff > 0 && c.shared_ff > 0, "expert and shared expert widths must be positive");
  need(c.ssm_conv_kernel > 0 && c.ssm_state > 0 && c.ssm_groups > 0 && c.ssm_dt_rank > 0,
       "ssm conv_kernel, state_size, group_count and time_step_rank must be positive");
  need(c.ssm_dt_rank % c.ssm_groups == 0,
       fmt::format("ssm.time_step_rank (Hv) {} is not a multiple of ssm.group_count (Hk) {}",
                   c.ssm_dt_rank, c.ssm_groups));
  need(c.ssm_inner == c.ssm_dt_rank * c.ssm_state,
       fmt::format("ssm.inner_size {} != time_step_rank {} x state_size {}", c.ssm_inner,
                   c.ssm_dt_rank, c.ssm_state));
  need(c.vocab > 0, "the vocabulary is empty (the file has neither tokenizer.ggml.tokens nor qwen35moe.vocab_size)");
  need(int64_t(c.is_recurrent.size()) == c.n_layers,
       fmt::format("{} layer kinds for {} layers", c.is_recurrent.size(), c.n_layers));
  need(c.rms_eps > 0, "layer_norm_rms_epsilon must be positive");
}

Qwen35MoeConfig read_config(const gguf::Metadata& m) {
  const std::string arch = m.get_string("general.architecture");
  if (arch != kQwen35MoeArch)
    fail("{}: general.architecture is \"{}\", expected \"{}\"", m.source(), arch, kQwen35MoeArch);
  Qwen35MoeConfig c;
  const int64_t blocks = positive(m, "block_count", 1024);
  c.n_mtp_layers = m.get_int64_or(key("nextn_predict_layers"), 0);
  if (c.n_mtp_layers < 0 || c.n_mtp_layers >= blocks)
    fail("{}: {} = {} does not fit block_count {}", m.source(), key("nextn_predict_layers"),
         c.n_mtp_layers, blocks);
  c.n_layers = blocks - c.n_mtp_layers;
  c.hidden = positive(m, "embedding_length", 1 << 18);
  c.context_length = positive(m, "context_length", int64_t(1) << 27);
  c.n_heads = positive(m, "attention.head_count", 1024);
  c.n_kv_heads = positive(m, "attention.head_count_kv", 1024);
  c.head_dim = positive(m, "attention.key_length", 4096);
  const int64_t value_length = positive(m, "attention.value_length", 4096);
  if (value_length != c.head_dim)
    fail("{}: attention.value_length {} != key_length {} (qwen35moe uses one head_dim)",
         m.source(), value_length, c.head_dim);
  c.rms_eps = positive_real(m, "attention.layer_norm_rms_epsilon");
  c.rope_theta = positive_real(m, "rope.freq_base");
  c.rope_dims = positive(m, "rope.dimension_count", 4096);
  if (m.contains(key("rope.dimension_sections")))
    for (int64_t v : m.get_integers(key("rope.dimension_sections"))) {
      if (v < 0 || v > c.head_dim)
        fail("{}: {} holds {}, outside 0..key_length {}", m.source(), key("rope.dimension_sections"), v, c.head_dim);
      c.rope_sections.push_back(int32_t(v));
    }
  c.n_experts = positive(m, "expert_count", 1 << 16);
  c.n_experts_used = positive(m, "expert_used_count", 1 << 16);
  c.expert_ff = positive(m, "expert_feed_forward_length", 1 << 20);
  c.shared_ff = positive(m, "expert_shared_feed_forward_length", 1 << 20);
  c.ssm_conv_kernel = positive(m, "ssm.conv_kernel", 64);
  c.ssm_state = positive(m, "ssm.state_size", 4096);
  c.ssm_groups = positive(m, "ssm.group_count", 1024);
  c.ssm_dt_rank = positive(m, "ssm.time_step_rank", 1 << 16);
  c.ssm_inner = positive(m, "ssm.inner_size", 1 << 24);
  if (m.contains("tokenizer.ggml.tokens"))
    c.vocab = int64_t(m.get_array("tokenizer.ggml.tokens").size());
  else
    c.vocab = m.get_int64_or(key("vocab_size"), 0);
  c.is_recurrent = read_layer_kinds(m, c.n_layers);
  try {
    validate_config(c);
  } catch (const Error& e) {
    fail("{}: {}", m.source(), e.what());
  }
  return c;
}

void write_config(const Qwen35MoeConfig& c, gguf::Metadata& m) {
  validate_config(c);
  auto u32 = [&m](const char* name, int64_t v) { m.set(key(name), gguf::Value(uint32_t(v))); };
  m.set("general.architecture", gguf::Value(kQwen35MoeArch));
  u32("block_count", c.n_blocks());
  u32("nextn_predict_layers", c.n_mtp_layers);
  u32("context_length", c.context_length);
  u32("embedding_length", c.hidden);
  u32("attention.head_count", c.n_heads);
  u32("attention.head_count_kv", c.n_kv_heads);
  u32("attention.key_length", c.head_dim);
  u32("attention.value_length", c.head_dim);
  m.set(key("attention.layer_norm_rms_epsilon"), gguf::Value(float(c.rms_eps)));
  m.set(key("rope.freq_base"), gguf::Value(float(c.rope_theta)));
  u32("rope.dimension_count", c.rope_dims);
  if (!c.rope_sections.empty())
    m.set(key("rope.dimension_sections"), gguf::Value(gguf::Array(c.rope_sections)));
  u32("expert_count", c.n_experts);
  u32("expert_used_count", c.n_experts_used);
  u32("expert_feed_forward_length", c.expert_ff);
  u32("expert_shared_feed_forward_length", c.shared_ff);
  u32("ssm.conv_kernel", c.ssm_conv_kernel);
  u32("ssm.state_size", c.ssm_state);
  u32("ssm.group_count", c.ssm_groups);
  u32("ssm.time_step_rank", c.ssm_dt_rank);
  u32("ssm.inner_size", c.ssm_inner);
  const int64_t interval = c.full_attention_interval();
  u32("full_attention_interval", interval > 0 ? interval : 4);
  // The per-block array covers the MTP blocks too (false: full attention), which an interval
  // cannot express when block n_layers would fall on a DeltaNet slot.
  if (interval == 0 || c.n_mtp_layers > 0) {
    std::vector<bool> flags(c.is_recurrent.begin(), c.is_recurrent.end());
    flags.resize(size_t(c.n_blocks()), false);
    m.set(key("attention.recurrent_layers"), gguf::Value(gguf::Array(std::move(flags))));
  }
}

const char* role_name(TensorRole role) {
  switch (role) {
    case TensorRole::embedding: return "embedding";
    case TensorRole::output: return "output";
    case TensorRole::norm: return "norm";
    case TensorRole::router: return "router";
    case TensorRole::expert_gate: return "expert_gate";
    case TensorRole::expert_up: return "expert_up";
    case TensorRole::expert_down: return "expert_down";
    case TensorRole::shared_gate_inp: return "shared_gate_inp";
    case TensorRole::shared_gate: return "shared_gate";
    case TensorRole::shared_up: return "shared_up";
    case TensorRole::shared_down: return "shared_down";
    case TensorRole::attn_q: return "attn_q";
    case TensorRole::attn_k: return "attn_k";
    case TensorRole::attn_v: return "attn_v";
    case TensorRole::attn_output: return "attn_output";
    case TensorRole::ssm_qkv: return "ssm_qkv";
    case TensorRole::ssm_gate: return "ssm_gate";
    case TensorRole::ssm_beta: return "ssm_beta";
    case TensorRole::ssm_alpha: return "ssm_alpha";
    case TensorRole::ssm_out: return "ssm_out";
    case TensorRole::ssm_conv: return "ssm_conv";
    case TensorRole::ssm_a: return "ssm_a";
    case TensorRole::ssm_dt: return "ssm_dt";
    case TensorRole::mtp_eh_proj: return "mtp_eh_proj";
  }
  return "?";
}

namespace {

using Specs = std::vector<TensorSpec>;

void add(Specs& s, int64_t block, const std::string& name, std::vector<int64_t> ne, TensorRole r) {
  const std::string full = block < 0 ? name : fmt::format("blk.{}.{}", block, name);
  s.push_back(TensorSpec{full, std::move(ne), r, block});
}

void add_full_attention(Specs& s, const Qwen35MoeConfig& c, int64_t b) {
  const int64_t h = c.hidden;
  add(s, b, "attn_q.weight", {h, 2 * c.q_dim()}, TensorRole::attn_q);  // q|gate per head
  add(s, b, "attn_k.weight", {h, c.kv_dim()}, TensorRole::attn_k);
  add(s, b, "attn_v.weight", {h, c.kv_dim()}, TensorRole::attn_v);
  add(s, b, "attn_output.weight", {c.q_dim(), h}, TensorRole::attn_output);
  add(s, b, "attn_q_norm.weight", {c.head_dim}, TensorRole::norm);
  add(s, b, "attn_k_norm.weight", {c.head_dim}, TensorRole::norm);
}

void add_delta_net(Specs& s, const Qwen35MoeConfig& c, int64_t b) {
  const int64_t h = c.hidden;
  add(s, b, "attn_qkv.weight", {h, c.conv_channels()}, TensorRole::ssm_qkv);
  add(s, b, "attn_gate.weight", {h, c.ssm_value_dim()}, TensorRole::ssm_gate);
  add(s, b, "ssm_conv1d.weight", {c.ssm_conv_kernel, c.conv_channels()}, TensorRole::ssm_conv);
  add(s, b, "ssm_dt.bias", {c.ssm_dt_rank}, TensorRole::ssm_dt);
  add(s, b, "ssm_a", {c.ssm_dt_rank}, TensorRole::ssm_a);
  add(s, b, "ssm_beta.weight", {h, c.ssm_dt_rank}, TensorRole::ssm_beta);
  add(s, b, "ssm_alpha.weight", {h, c.ssm_dt_rank}, TensorRole::ssm_alpha);
  add(s, b, "ssm_norm.weight", {c.ssm_state}, TensorRole::norm);
  add(s, b, "ssm_out.weight", {c.ssm_value_dim(), h}, TensorRole::ssm_out);
}

void add_moe(Specs& s, const Qwen35MoeConfig& c, int64_t b) {
  const int64_t h = c.hidden, e = c.n_experts;
  add(s, b, "ffn_gate_inp.weight", {h, e}, TensorRole::router);
  add(s, b, "ffn_gate_exps.weight", {h, c.expert_ff, e}, TensorRole::expert_gate);
  add(s, b, "ffn_up_exps.weight", {h, c.expert_ff, e}, TensorRole::expert_up);
  add(s, b, "ffn_down_exps.weight", {c.expert_ff, h, e}, TensorRole::expert_down);
  add(s, b, "ffn_gate_inp_shexp.weight", {h}, TensorRole::shared_gate_inp);
  add(s, b, "ffn_gate_shexp.weight", {h, c.shared_ff}, TensorRole::shared_gate);
  add(s, b, "ffn_up_shexp.weight", {h, c.shared_ff}, TensorRole::shared_up);
  add(s, b, "ffn_down_shexp.weight", {c.shared_ff, h}, TensorRole::shared_down);
}

void add_block(Specs& s, const Qwen35MoeConfig& c, int64_t b) {
  const bool mtp = b >= c.n_layers;
  add(s, b, "attn_norm.weight", {c.hidden}, TensorRole::norm);
  if (mtp) {
    add(s, b, "nextn.eh_proj.weight", {2 * c.hidden, c.hidden}, TensorRole::mtp_eh_proj);
    add(s, b, "nextn.enorm.weight", {c.hidden}, TensorRole::norm);
    add(s, b, "nextn.hnorm.weight", {c.hidden}, TensorRole::norm);
    add(s, b, "nextn.shared_head_norm.weight", {c.hidden}, TensorRole::norm);
  }
  if (c.block_is_recurrent(b))
    add_delta_net(s, c, b);
  else
    add_full_attention(s, c, b);
  add(s, b, "post_attention_norm.weight", {c.hidden}, TensorRole::norm);
  add_moe(s, c, b);
}

}  // namespace

std::vector<TensorSpec> tensor_specs(const Qwen35MoeConfig& c) {
  validate_config(c);
  Specs s;
  add(s, -1, "token_embd.weight", {c.hidden, c.vocab}, TensorRole::embedding);
  for (int64_t b = 0; b < c.n_blocks(); ++b) add_block(s, c, b);
  add(s, -1, "output_norm.weight", {c.hidden}, TensorRole::norm);
  add(s, -1, "output.weight", {c.hidden, c.vocab}, TensorRole::output);
  return s;
}

Qwen35MoeConfig qwen36_35b_a3b_config(bool with_mtp) {
  Qwen35MoeConfig c;
  c.hidden = 2048;
  c.n_layers = 40;
  c.n_mtp_layers = with_mtp ? 1 : 0;
  c.n_heads = 16;
  c.n_kv_heads = 2;
  c.head_dim = 256;
  c.rope_dims = 64;
  c.rope_theta = 1e7;
  c.rope_sections = {11, 11, 10, 0};
  c.rms_eps = 1e-6;
  c.n_experts = 256;
  c.n_experts_used = 8;
  c.expert_ff = 512;
  c.shared_ff = 512;
  c.ssm_conv_kernel = 4;
  c.ssm_state = 128;
  c.ssm_groups = 16;
  c.ssm_dt_rank = 32;
  c.ssm_inner = 32 * 128;
  c.vocab = 248320;
  c.context_length = 262144;
  c.is_recurrent.resize(40);
  for (int64_t i = 0; i < 40; ++i) c.is_recurrent[size_t(i)] = (i + 1) % 4 != 0;
  return c;
}

}  // namespace lode::model
