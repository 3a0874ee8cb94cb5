#include "model/convert.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <iterator>
#include <optional>
#include <type_traits>

#include "core/error.h"
#include "gguf/writer.h"
#include "model/hf_tensors.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "tokenizer/hf_tokenizer.h"

namespace lode::model {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// A size of the model: an integer of at least 1 (0 heads divided by zero), at most 2^24 (none is near).
int64_t get_int(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number_integer()) fail("config.json: missing integer '{}'", key);
  const int64_t v = j[key].get<int64_t>();
  if (v < 1 || v > (int64_t(1) << 24)) fail("config.json: '{}' is {}, outside 1..{}", key, v, int64_t(1) << 24);
  return v;
}

// An optional field of type T (an integer, a number, a bool), or the fallback when absent or null;
// another type is refused naming the key.
template <class T> T get_or(const json& j, const char* key, T fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  const bool fits = std::is_same_v<T, bool> ? v.is_boolean()
                    : std::is_integral_v<T> ? v.is_number_integer()
                                            : v.is_number();
  if (!fits) fail("config.json: '{}' is {}, not {}", key, v.dump(), std::is_same_v<T, bool> ? "true or false"
                                                                  : std::is_integral_v<T> ? "an integer" : "a number");
  return v.get<T>();
}

// The layer pattern: layer_types when present, else full_attention_interval.
std::vector<bool> recurrent_layers(const json& t, int64_t n_layers) {
  std::vector<bool> recurrent(size_t(n_layers), false);
  if (t.contains("layer_types") && t["layer_types"].is_array()) {
    const auto& types = t["layer_types"];
    if (int64_t(types.size()) != n_layers)
      fail("config.json: layer_types has {} entries for {} layers", types.size(), n_layers);
    for (size_t i = 0; i < types.size(); ++i) {
      const std::string type = types[i].is_string() ? types[i].get<std::string>() : types[i].dump();
      if (type != "linear_attention" && type != "full_attention")
        fail("config.json: layer_types[{}] is '{}' (expected linear_attention or full_attention)", i, type);
      recurrent[i] = type == "linear_attention";
    }
    return recurrent;
  }
  const int64_t interval = get_or<int64_t>(t, "full_attention_interval", 4);
  if (interval <= 0) fail("config.json: full_attention_interval must be positive");
  for (int64_t i = 0; i < n_layers; ++i) recurrent[size_t(i)] = (i + 1) % interval != 0;
  return recurrent;
}

// rope_theta, partial_rotary_factor and mrope_section live in rope_parameters (transformers 5) or
// at the top level (older configs).
void read_rope(const json& t, Qwen35MoeConfig& c) {
  const json& rope = t.contains("rope_parameters") && t["rope_parameters"].is_object() ? t["rope_parameters"] : t;
  c.rope_theta = get_or<double>(rope, "rope_theta", get_or<double>(t, "rope_theta", 1e7));
  const double factor = get_or<double>(rope, "partial_rotary_factor", get_or<double>(t, "partial_rotary_factor", 0.25));
  if (!(factor > 0 && factor <= 1)) fail("config.json: partial_rotary_factor is {}, outside (0, 1]", factor);
  c.rope_dims = int64_t(std::lround(double(c.head_dim) * factor));
  c.rope_sections = {11, 11, 10, 0};
  if (rope.contains("mrope_section") && rope["mrope_section"].is_array()) {
    c.rope_sections.assign(4, 0);
    for (size_t i = 0; i < rope["mrope_section"].size() && i < 4; ++i) {
      const json& s = rope["mrope_section"][i];
      if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > c.head_dim)
        fail("config.json: mrope_section[{}] is {}, not an integer in 0..head_dim {}", i, s.dump(), c.head_dim);
      c.rope_sections[i] = s.get<int32_t>();
    }
  }
}

}  // namespace

Qwen35MoeConfig config_from_hf(const json& root) {
  const json& t = root.contains("text_config") && root["text_config"].is_object() ? root["text_config"] : root;
  Qwen35MoeConfig c;
  c.hidden = get_int(t, "hidden_size");
  c.n_layers = get_int(t, "num_hidden_layers");
  c.n_mtp_layers = get_or<int64_t>(t, "mtp_num_hidden_layers", 0);
  c.n_heads = get_int(t, "num_attention_heads");
  c.n_kv_heads = get_int(t, "num_key_value_heads");
  c.head_dim = get_or<int64_t>(t, "head_dim", c.hidden / c.n_heads);
  c.rms_eps = get_or<double>(t, "rms_norm_eps", 1e-6);
  c.n_experts = get_int(t, "num_experts");
  c.n_experts_used = get_int(t, "num_experts_per_tok");
  c.expert_ff = get_int(t, "moe_intermediate_size");
  c.shared_ff = get_int(t, "shared_expert_intermediate_size");
  c.ssm_conv_kernel = get_or<int64_t>(t, "linear_conv_kernel_dim", 4);
  c.ssm_state = get_int(t, "linear_key_head_dim");
  if (get_or<int64_t>(t, "linear_value_head_dim", c.ssm_state) != c.ssm_state)
    fail("config.json: linear_value_head_dim differs from linear_key_head_dim; qwen35moe needs dk = dv");
  c.ssm_groups = get_int(t, "linear_num_key_heads");
  c.ssm_dt_rank = get_int(t, "linear_num_value_heads");
  c.ssm_inner = c.ssm_dt_rank * c.ssm_state;
  c.vocab = get_int(t, "vocab_size");
  c.context_length = get_or<int64_t>(t, "max_position_embeddings", 262144);
  c.is_recurrent = recurrent_layers(t, c.n_layers);
  read_rope(t, c);
  if (!get_or<bool>(t, "norm_topk_prob", true))
    fail("config.json: norm_topk_prob is false; qwen35moe renormalises the top-k weights");
  validate_config(c);
  return c;
}

}  // namespace lode::model

namespace lode::model {
namespace {

json read_json(const fs::path& path) {
  if (!fs::is_regular_file(path)) fail("{}: not a file", path.string());
  std::ifstream in(path);
  if (!in) fail("{}: cannot open", path.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
}

// Norms, router, conv, ssm_a/ssm_dt and the shared-expert gate vector stay F32, as in llama.cpp's
// files; so does any tensor whose rows are not whole blocks of the requested type.
GgmlType type_for(const TensorSpec& spec, GgmlType outtype) {
  switch (spec.role) {
    case TensorRole::norm: case TensorRole::router: case TensorRole::ssm_conv:
    case TensorRole::ssm_a: case TensorRole::ssm_dt: case TensorRole::shared_gate_inp:
      return GgmlType::F32;
    default: break;
  }
  if (spec.ne.size() < 2 || spec.ne[0] % traits(outtype).block_size != 0) return GgmlType::F32;
  return outtype;
}

// The chat template a checkpoint publishes: chat_template.jinja, else tokenizer_config.json's.
std::optional<std::string> read_chat_template(const fs::path& hf_dir) {
  if (fs::exists(hf_dir / "chat_template.jinja")) {
    std::ifstream in(hf_dir / "chat_template.jinja", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  if (!fs::exists(hf_dir / "tokenizer_config.json")) return std::nullopt;
  const json config = read_json(hf_dir / "tokenizer_config.json");
  if (config.contains("chat_template") && config["chat_template"].is_string())
    return config["chat_template"].get<std::string>();
  return std::nullopt;
}

}  // namespace

std::vector<fs::path> convert_checkpoint(const fs::path& hf_dir, const fs::path& out,
                                         const ConvertOptions& options) {
  const GgmlType t = options.outtype;
  if (t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16 && t != GgmlType::Q8_0)
    fail("--outtype {}: convert writes f32, f16, bf16 or q8_0 (use lode quantize for others)", traits(t).name);
  const json hf_config = read_json(hf_dir / "config.json");
  const Qwen35MoeConfig config = config_from_hf(hf_config);
  const SafetensorsCheckpoint checkpoint(hf_dir);
  const HfTensorSource source(checkpoint, config);
  // The lm head is the embedding only where the config says the two are tied (a missing lm_head
  // was tied silently).
  const json& text = hf_config.contains("text_config") && hf_config["text_config"].is_object() ? hf_config["text_config"]
                                                                                               : hf_config;
  if (!checkpoint.find("lm_head.weight") && !get_or<bool>(text, "tie_word_embeddings", get_or<bool>(hf_config, "tie_word_embeddings", false)))
    fail("{}: the checkpoint has no lm_head.weight, and config.json does not tie the word embeddings", hf_dir.string());

  gguf::Writer writer;
  writer.set("general.architecture", kQwen35MoeArch);
  writer.set("general.name", hf_dir.filename().string());
  write_config(config, writer.metadata());
  if (fs::exists(hf_dir / "tokenizer.json")) {
    tokenizer::store_hf_tokenizer(read_json(hf_dir / "tokenizer.json"), config.vocab, writer.metadata());
    if (auto chat_template = read_chat_template(hf_dir))
      writer.set("tokenizer.chat_template", std::move(*chat_template));
  } else {
    write_synth_vocab(config.vocab, writer.metadata());
  }

  const std::vector<TensorSpec> specs = tensor_specs(config);
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& spec = specs[i];
    const GgmlType type = type_for(spec, t);
    writer.add_tensor(spec.name, type, spec.ne, [&, i, type](std::span<uint8_t> dst) {
      const std::vector<float> values = source.tensor(spec);
      traits(type).quantize(values.data(), dst.data(), int64_t(values.size()));
      if (options.on_tensor) options.on_tensor(i, specs.size(), spec.name);
    });
  }
  return writer.write(out);
}

}  // namespace lode::model
