#include "model/weights.h"

#include <fmt/format.h>

#include <charconv>
#include <string>

#include "core/error.h"

namespace lode::model {
namespace {


std::string block_name(int64_t block, const char* name) {
  return fmt::format("blk.{}.{}", block, name);
}

void check_readable(const gguf::TensorInfo& t) {
  if (t.ggml_type() != GgmlType::F32 && t.type->dequantize == nullptr) {
    fail("tensor {} has type {}, which lode cannot read: make the file again from its source in a type lode reads "
         "(lode convert from the Hugging Face checkpoint, or llama.cpp's llama-quantize)", t.name, t.type->name);
  }
}

void check_shape(const gguf::TensorInfo& t, std::initializer_list<int64_t> expected) {
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  size_t i = 0;
  for (int64_t n : expected) ne[i++] = n;
  if (ne != t.ne) {
    fail("tensor {} has shape {} but the model's config needs [{}]; the file does not match its "
         "own qwen35moe.* metadata", t.name, t.shape_string(), fmt::join(expected, ", "));
  }
  check_readable(t);
}

MatrixView matrix_of(const gguf::TensorInfo& t) {
  return MatrixView{t.type, t.data, t.ne[0], t.ne[1], row_bytes(t.ggml_type(), t.ne[0])};
}

MatrixView bind_matrix(const gguf::Reader& reader, const std::string& name, int64_t cols,
                       int64_t rows) {
  const gguf::TensorInfo& t = reader.tensor(name);
  check_shape(t, {cols, rows});
  return matrix_of(t);
}

// All elements of a tensor as float32 (for the small vectors).
std::vector<float> to_floats(const gguf::TensorInfo& t) {
  check_readable(t);
  const MatrixView m{t.type, t.data, t.ne[0], t.n_rows(), row_bytes(t.ggml_type(), t.ne[0])};
  std::vector<float> out(size_t(t.n_elements()));
  for (int64_t r = 0; r < m.rows; ++r) dequantize_row(m, r, out.data() + r * m.cols);
  return out;
}

std::vector<float> bind_vector(const gguf::Reader& reader, const std::string& name, int64_t n) {
  const gguf::TensorInfo& t = reader.tensor(name);
  check_shape(t, {n});
  return to_floats(t);
}

ExpertStack bind_experts(const gguf::Reader& reader, const std::string& name, int64_t cols,
                         int64_t rows, int64_t n_experts) {
  const gguf::TensorInfo& t = reader.tensor(name);
  check_shape(t, {cols, rows, n_experts});
  const MatrixView m = matrix_of(t);
  return ExpertStack{m, m.row_bytes * size_t(rows), n_experts};
}

AttentionWeights bind_attention(const gguf::Reader& r, const Qwen35MoeConfig& c, int64_t b) {
  AttentionWeights w;
  w.q = bind_matrix(r, block_name(b, "attn_q.weight"), c.hidden, 2 * c.q_dim());
  w.k = bind_matrix(r, block_name(b, "attn_k.weight"), c.hidden, c.kv_dim());
  w.v = bind_matrix(r, block_name(b, "attn_v.weight"), c.hidden, c.kv_dim());
  w.output = bind_matrix(r, block_name(b, "attn_output.weight"), c.q_dim(), c.hidden);
  w.q_norm = bind_vector(r, block_name(b, "attn_q_norm.weight"), c.head_dim);
  w.k_norm = bind_vector(r, block_name(b, "attn_k_norm.weight"), c.head_dim);
  return w;
}

DeltaNetWeights bind_deltanet(const gguf::Reader& r, const Qwen35MoeConfig& c, int64_t b) {
  DeltaNetWeights w;
  const int64_t hv = c.ssm_dt_rank;
  w.qkv = bind_matrix(r, block_name(b, "attn_qkv.weight"), c.hidden, c.conv_channels());
  w.gate = bind_matrix(r, block_name(b, "attn_gate.weight"), c.hidden, c.ssm_value_dim());
  w.beta = bind_matrix(r, block_name(b, "ssm_beta.weight"), c.hidden, hv);
  w.alpha = bind_matrix(r, block_name(b, "ssm_alpha.weight"), c.hidden, hv);
  w.out = bind_matrix(r, block_name(b, "ssm_out.weight"), c.ssm_value_dim(), c.hidden);
  const gguf::TensorInfo& conv = r.tensor(block_name(b, "ssm_conv1d.weight"));
  check_shape(conv, {c.ssm_conv_kernel, c.conv_channels()});
  w.conv = to_floats(conv);
  w.dt_bias = bind_vector(r, block_name(b, "ssm_dt.bias"), hv);
  w.a = bind_vector(r, block_name(b, "ssm_a"), hv);
  w.norm = bind_vector(r, block_name(b, "ssm_norm.weight"), c.ssm_state);
  return w;
}

MoeWeights bind_moe(const gguf::Reader& r, const Qwen35MoeConfig& c, int64_t b) {
  MoeWeights w;
  const int64_t e = c.n_experts, ff = c.expert_ff;
  w.router = bind_matrix(r, block_name(b, "ffn_gate_inp.weight"), c.hidden, e);
  const std::string fused = block_name(b, "ffn_gate_up_exps.weight");
  if (r.find_tensor(fused) != nullptr) {
    // One [hidden, 2 * ff, E] tensor: per expert, ff gate rows then ff up rows.
    const ExpertStack both = bind_experts(r, fused, c.hidden, 2 * ff, e);
    w.gate = both;
    w.gate.first.rows = ff;
    w.up = w.gate;
    w.up.first.data += w.up.first.row_bytes * size_t(ff);
  } else {
    w.gate = bind_experts(r, block_name(b, "ffn_gate_exps.weight"), c.hidden, ff, e);
    w.up = bind_experts(r, block_name(b, "ffn_up_exps.weight"), c.hidden, ff, e);
  }
  w.down = bind_experts(r, block_name(b, "ffn_down_exps.weight"), ff, c.hidden, e);
  if (c.shared_ff > 0) {
    const gguf::TensorInfo& gi = r.tensor(block_name(b, "ffn_gate_inp_shexp.weight"));
    if (gi.n_elements() != c.hidden) {
      fail("tensor {} has shape {} but needs {} values", gi.name, gi.shape_string(), c.hidden);
    }
    w.shared_gate_inp = to_floats(gi);
    w.shared_gate = bind_matrix(r, block_name(b, "ffn_gate_shexp.weight"), c.hidden, c.shared_ff);
    w.shared_up = bind_matrix(r, block_name(b, "ffn_up_shexp.weight"), c.hidden, c.shared_ff);
    w.shared_down = bind_matrix(r, block_name(b, "ffn_down_shexp.weight"), c.shared_ff, c.hidden);
  }
  return w;
}

// The block a tensor's name puts it in (blk.N.*), or -1.
int64_t block_of(const std::string& name) {
  if (!name.starts_with("blk.")) return -1;
  int64_t block = -1;
  const char* first = name.data() + 4;
  const auto [end, ec] = std::from_chars(first, name.data() + name.size(), block);
  return ec == std::errc() && end != first && *end == '.' ? block : -1;
}

// Every blk.N.* tensor lies in a block the metadata counts, and the MTP block's (nextn.*) in the
// block after the layers: a file whose block_count or nextn_predict_layers disagrees with its
// tensors would otherwise run as another model (a 9-block file that said 5 ran with 4 layers).
void check_blocks(const gguf::Reader& reader, const Qwen35MoeConfig& config) {
  for (const gguf::TensorInfo& t : reader.tensors()) {
    const int64_t block = block_of(t.name);
    if (block >= config.n_blocks())
      fail("{}: tensor {} is in block {}, but qwen35moe.block_count is {}: the metadata does not describe this "
           "file", reader.metadata().source(), t.name, block, config.n_blocks());
    if (block >= 0 && t.name.find(".nextn.") != std::string::npos && block != config.n_layers)
      fail("{}: tensor {} belongs to the MTP block, which qwen35moe.block_count {} and nextn_predict_layers {} put "
           "in block {}: the metadata does not describe this file", reader.metadata().source(), t.name,
           config.n_blocks(), config.n_mtp_layers, config.n_layers);
  }
}

}  // namespace

MtpWeights bind_mtp_weights(const gguf::Reader& reader, const Qwen35MoeConfig& config) {
  if (config.n_mtp_layers < 1)
    fail("{} has no MTP block (qwen35moe.nextn_predict_layers is 0; no blk.{}.nextn.* tensors): it cannot draft "
         "its own tokens, run it without --mtp", reader.metadata().source(), config.n_layers);
  const int64_t b = config.n_layers, h = config.hidden;
  for (const char* name : {"nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight",
                           "nextn.shared_head_norm.weight", "attn_q.weight", "ffn_gate_inp.weight"})
    if (reader.find_tensor(block_name(b, name)) == nullptr)
      fail("{}: the MTP block lacks {}; the file's nextn_predict_layers says it has one", reader.metadata().source(),
           block_name(b, name));
  MtpWeights w;
  w.eh_proj = bind_matrix(reader, block_name(b, "nextn.eh_proj.weight"), 2 * h, h);
  w.enorm = bind_vector(reader, block_name(b, "nextn.enorm.weight"), h);
  w.hnorm = bind_vector(reader, block_name(b, "nextn.hnorm.weight"), h);
  w.shared_head_norm = bind_vector(reader, block_name(b, "nextn.shared_head_norm.weight"), h);
  w.layer.recurrent = false;
  w.layer.attn_norm = bind_vector(reader, block_name(b, "attn_norm.weight"), h);
  w.layer.post_attention_norm = bind_vector(reader, block_name(b, "post_attention_norm.weight"), h);
  w.layer.attention = bind_attention(reader, config, b);
  w.layer.moe = bind_moe(reader, config, b);
  return w;
}

ModelWeights bind_weights(const gguf::Reader& reader, const Qwen35MoeConfig& config) {
  check_blocks(reader, config);
  ModelWeights w;
  w.config = config;
  w.token_embd = bind_matrix(reader, "token_embd.weight", config.hidden, config.vocab);
  w.output_norm = bind_vector(reader, "output_norm.weight", config.hidden);
  w.output = reader.find_tensor("output.weight") != nullptr
                 ? bind_matrix(reader, "output.weight", config.hidden, config.vocab)
                 : w.token_embd;
  for (int64_t b = 0; b < config.n_layers; ++b) {
    LayerWeights layer;
    layer.recurrent = config.block_is_recurrent(b);
    layer.attn_norm = bind_vector(reader, block_name(b, "attn_norm.weight"), config.hidden);
    layer.post_attention_norm =
        bind_vector(reader, block_name(b, "post_attention_norm.weight"), config.hidden);
    if (layer.recurrent) {
      layer.deltanet = bind_deltanet(reader, config, b);
    } else {
      layer.attention = bind_attention(reader, config, b);
    }
    layer.moe = bind_moe(reader, config, b);
    w.layers.push_back(std::move(layer));
  }
  // The MTP block is optional: a file whose block does not bind still runs, without drafts.
  try {
    w.mtp = bind_mtp_weights(reader, config);
  } catch (const Error& e) {
    w.mtp_unavailable = e.what();
  }
  return w;
}

ModelWeights layer_share(const ModelWeights& weights, int64_t first, int64_t end) {
  const int64_t n = int64_t(weights.layers.size());
  if (first < 0 || end > n || first >= end)
    fail("a share of layers [{}, {}) of a model of {} layers: it must hold at least one of them", first, end, n);
  ModelWeights share;
  share.config = weights.config;
  share.config.n_layers = end - first;
  share.config.is_recurrent.assign(weights.config.is_recurrent.begin() + first, weights.config.is_recurrent.begin() + end);
  share.token_embd = weights.token_embd;
  share.output_norm = weights.output_norm;
  share.output = weights.output;
  share.layers.assign(weights.layers.begin() + first, weights.layers.begin() + end);
  if (end == n) {
    share.mtp = weights.mtp;
    share.mtp_unavailable = weights.mtp_unavailable;
  } else {
    share.mtp_unavailable = "the MTP block goes with the last layer, on the last GPU";
  }
  return share;
}

}  // namespace lode::model
