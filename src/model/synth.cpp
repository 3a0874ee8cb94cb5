#include "model/synth.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "gguf/writer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/hf_tokenizer.h"

namespace lode::model {

// ---------------------------------------------------------------------------------------------
// Presets
// ---------------------------------------------------------------------------------------------

namespace {

// A small model with both layer kinds and the 35B's shape where it matters (Hv = 2 Hk, GQA,
// rope = head_dim / 4), every row length a multiple of 256 where the recipes want K-quants.
Qwen35MoeConfig tiny_config() {
  Qwen35MoeConfig c;
  c.hidden = 512;
  c.n_layers = 4;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 128;
  c.rope_dims = 32;  // a quarter of head_dim, like the 35B
  c.rope_theta = 1e7;
  c.rope_sections = {6, 5, 5, 0};  // sums to rope_dims / 2, like [11, 11, 10, 0]
  c.rms_eps = 1e-6;
  c.n_experts = 16;
  c.n_experts_used = 4;
  c.expert_ff = 256;
  c.shared_ff = 256;
  c.ssm_conv_kernel = 4;
  c.ssm_state = 64;
  c.ssm_groups = 2;
  c.ssm_dt_rank = 4;
  c.ssm_inner = 4 * 64;
  c.vocab = 1024;
  c.context_length = 4096;
  return c;
}

void set_layer_kinds(Qwen35MoeConfig& c, int64_t layers) {
  c.n_layers = layers;
  c.is_recurrent.assign(size_t(layers), true);
  for (int64_t i = 0; i < layers; ++i) c.is_recurrent[size_t(i)] = (i + 1) % 4 != 0;
}

}  // namespace

Qwen35MoeConfig synth_config(const std::string& preset, int64_t layers, bool mtp) {
  Qwen35MoeConfig c;
  if (preset == "qwen3.6-35b-a3b")
    c = qwen36_35b_a3b_config(false);
  else if (preset == "tiny")
    c = tiny_config();
  else
    fail("no synth preset named \"{}\" (presets: qwen3.6-35b-a3b, tiny)", preset);
  if (layers < 0) fail("--layers {}: must be positive", layers);
  set_layer_kinds(c, layers > 0 ? layers : c.n_layers);
  c.n_mtp_layers = mtp ? 1 : 0;
  validate_config(c);
  return c;
}

std::vector<SynthTensor> synth_plan(const Qwen35MoeConfig& config, const Recipe& recipe) {
  std::vector<SynthTensor> plan;
  for (TensorSpec& spec : tensor_specs(config)) {
    const GgmlType type = recipe_type(recipe, spec, config.n_blocks());
    uint64_t rows = 1;
    for (size_t d = 1; d < spec.ne.size(); ++d) rows *= uint64_t(spec.ne[d]);
    const uint64_t bytes = row_bytes(type, spec.ne[0]) * rows;
    plan.push_back(SynthTensor{std::move(spec), type, bytes});
  }
  return plan;
}

uint64_t synth_tensor_bytes(const Qwen35MoeConfig& config, const Recipe& recipe) {
  uint64_t total = 0;
  for (const SynthTensor& t : synth_plan(config, recipe)) total += t.bytes;
  return total;
}

// ---------------------------------------------------------------------------------------------
// Vocabulary: byte-level BPE in GPT-2's byte-to-unicode alphabet
// ---------------------------------------------------------------------------------------------

namespace {

constexpr int64_t kFirstRealSpecial = 248044;  // <|endoftext|> in the real vocabulary
struct Special {
  int64_t real_id;
  const char* text;
  int32_t type;  // 3 control, 4 user-defined
};
constexpr Special kSpecials[] = {
    {248044, "<|endoftext|>", 3}, {248045, "<|im_start|>", 3}, {248046, "<|im_end|>", 3},
    {248068, "<think>", 4},       {248069, "</think>", 4},
};
constexpr int64_t kSpecialCount = int64_t(std::size(kSpecials));

const char* kChatTemplate =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n<think>\\n' }}{% endif %}";

}  // namespace

void write_synth_vocab(int64_t vocab, gguf::Metadata& m) {
  if (vocab < 256 + kSpecialCount)
    fail("a synth vocabulary needs at least {} tokens, not {}", 256 + kSpecialCount, vocab);
  const bool real_ids = vocab > kSpecials[kSpecialCount - 1].real_id;
  const int64_t first_special = real_ids ? kFirstRealSpecial : vocab - kSpecialCount;
  const auto& sym = tokenizer::byte_symbols();

  std::vector<std::string> tokens(sym.begin(), sym.end());
  std::vector<int32_t> types(256, 1);
  std::vector<std::string> merges;
  tokens.reserve(size_t(vocab));
  // Merged tokens: every byte pair, then pair + byte; each with the merge that makes it.
  for (int64_t j = 0; int64_t(tokens.size()) < first_special; ++j) {
    std::string left, right;
    if (j < 65536) {
      left = sym[size_t(j / 256)];
      right = sym[size_t(j % 256)];
    } else {
      left = tokens[size_t(256 + (j - 65536) / 256)];
      right = sym[size_t((j - 65536) % 256)];
    }
    merges.push_back(left + " " + right);
    tokens.push_back(left + right);
    types.push_back(1);
  }
  std::vector<int64_t> special_ids;
  for (int64_t id = first_special; id < vocab; ++id) {
    std::string text = fmt::format("<|reserved_{}|>", id);
    int32_t type = 3;
    for (int64_t k = 0; k < kSpecialCount; ++k) {
      const int64_t want = real_ids ? kSpecials[k].real_id : first_special + k;
      if (want == id) text = kSpecials[k].text, type = kSpecials[k].type;
    }
    tokens.push_back(std::move(text));
    types.push_back(type);
  }
  auto id_of = [&](int64_t k) {
    return uint32_t(real_ids ? kSpecials[k].real_id : first_special + k);
  };
  m.set("tokenizer.ggml.model", gguf::Value("gpt2"));
  m.set("tokenizer.ggml.pre", gguf::Value("qwen35"));
  m.set("tokenizer.ggml.tokens", gguf::Value(gguf::Array(std::move(tokens))));
  m.set("tokenizer.ggml.token_type", gguf::Value(gguf::Array(std::move(types))));
  m.set("tokenizer.ggml.merges", gguf::Value(gguf::Array(std::move(merges))));
  m.set("tokenizer.ggml.eos_token_id", gguf::Value(id_of(2)));      // <|im_end|>
  m.set("tokenizer.ggml.padding_token_id", gguf::Value(id_of(0)));  // <|endoftext|>
  m.set("tokenizer.ggml.bos_token_id", gguf::Value(id_of(0)));
  m.set("tokenizer.ggml.add_bos_token", gguf::Value(false));
  m.set("tokenizer.chat_template", gguf::Value(kChatTemplate));
}

// ---------------------------------------------------------------------------------------------
// Weights
// ---------------------------------------------------------------------------------------------

namespace {

// splitmix64: a fast, seedable generator; one per row so rows fill in parallel deterministically.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
  float normal() {  // Box-Muller
    const float u1 = std::max(uniform(), 1e-7f), u2 = uniform();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
  }
};

uint64_t mix(uint64_t a, uint64_t b) { return Rng{a * 0x100000001B3ull ^ b}.next(); }

// How the values of one row are drawn.
struct RowLaw {
  enum Kind { gaussian, uniform, embedding, router, orthogonal } kind = gaussian;
  float a = 0, b = 0;  // gaussian: mean, std; uniform: lo, hi
};

// Shared across tensors: the direction every embedding row leans along (entries +-1) and, per
// block, each expert's routing bias along it.
struct Skew {
  std::vector<float> sign;                  // [hidden]
  std::vector<std::vector<float>> bias;     // [block][expert], logit offset / (hidden * c)
};

// Embedding rows are kEmbedLean * sign + kEmbedNoise * N(0,1): after RMSNorm their dot with
// `sign` is hidden * c, c = lean / sqrt(lean^2 + noise^2).
constexpr float kEmbedLean = 0.5f, kEmbedNoise = 0.5f;

RowLaw law_for(const TensorSpec& s) {
  const float fan_in = float(s.ne[0]);
  const float unit = 1.0f / std::sqrt(fan_in);
  switch (s.role) {
    case TensorRole::embedding: return {RowLaw::embedding};
    case TensorRole::router: return {RowLaw::router};
    // Orthogonal to the shared embedding direction, so logits depend on the token, not on it.
    case TensorRole::output: return {RowLaw::orthogonal};
    case TensorRole::norm: return {RowLaw::gaussian, 1.0f, 0.05f};  // +1 already folded in
    case TensorRole::ssm_conv: return {RowLaw::gaussian, 0.0f, 0.5f};
    case TensorRole::ssm_a: return {RowLaw::uniform, -16.0f, -1.0f};  // -exp(A_log), A_log in [0, ln 16]
    case TensorRole::ssm_dt: return {RowLaw::uniform, 0.0f, 2.0f};
    // Projections writing into the residual stream are small, so the stream stays dominated by
    // the embedding (keeps logits finite and the routing skew intact through depth).
    case TensorRole::expert_down: case TensorRole::shared_down: case TensorRole::attn_output:
    case TensorRole::ssm_out:
      return {RowLaw::gaussian, 0.0f, 0.1f * unit};
    default: return {RowLaw::gaussian, 0.0f, unit};
  }
}

void draw_row(const RowLaw& law, const Skew& skew, int64_t block, int64_t row, uint64_t seed,
              std::span<float> out) {
  Rng rng{mix(seed, uint64_t(row))};
  switch (law.kind) {
    case RowLaw::gaussian:
      for (float& v : out) v = law.a + law.b * rng.normal();
      break;
    case RowLaw::uniform:
      for (float& v : out) v = law.a + (law.b - law.a) * rng.uniform();
      break;
    case RowLaw::embedding:
      for (size_t i = 0; i < out.size(); ++i)
        out[i] = kEmbedLean * skew.sign[i] + kEmbedNoise * rng.normal();
      break;
    case RowLaw::router:
    case RowLaw::orthogonal: {
      // A random row orthogonal to `sign` (so the direction every token shares adds nothing to
      // it: uniform routing when unskewed); a router row adds its expert's bias along `sign`.
      const float unit = 1.0f / std::sqrt(float(out.size()));
      double along = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        out[i] = unit * rng.normal();
        along += double(out[i]) * skew.sign[i];
      }
      const float remove = float(along / double(out.size()));
      const float bias = law.kind == RowLaw::router ? skew.bias[size_t(block)][size_t(row)] : 0.0f;
      for (size_t i = 0; i < out.size(); ++i) out[i] += (bias - remove) * skew.sign[i];
      break;
    }
  }
}

// Rows of one tensor, drawn and quantized in parallel into `out`.
void draw_rows(const RowLaw& law, const Skew& skew, int64_t block, const TypeTraits& type,
               int64_t row_len, int64_t rows, uint64_t seed, uint8_t* out) {
  const size_t rb = row_bytes(type.type, row_len);
#pragma omp parallel
  {
    std::vector<float> floats(static_cast<size_t>(row_len));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      draw_row(law, skew, block, r, seed, floats);
      type.quantize(floats.data(), out + size_t(r) * rb, row_len);
    }
  }
}

// Large tensors tile a pool of pre-quantized rows (an odd number, started at a random offset per
// tensor), so a 20 GB model writes at disk speed; small ones are drawn whole.
constexpr size_t kPoolBytes = size_t(4) << 20;

class WeightMaker {
public:
  WeightMaker(const Qwen35MoeConfig& c, double route_skew, uint64_t seed) : seed_(seed) {
    Rng rng{mix(seed, 0x5EED)};
    skew_.sign.resize(size_t(c.hidden));
    for (float& s : skew_.sign) s = (rng.next() & 1) ? 1.0f : -1.0f;
    const float c_lean = kEmbedLean / std::sqrt(kEmbedLean * kEmbedLean + kEmbedNoise * kEmbedNoise);
    skew_.bias.resize(size_t(c.n_blocks()));
    for (auto& bias : skew_.bias) {
      // Expert of popularity rank k gets logit offset -S ln(k+1); ranks shuffled per block.
      std::vector<int64_t> rank(size_t(c.n_experts));
      std::iota(rank.begin(), rank.end(), 0);
      for (size_t i = rank.size(); i > 1; --i) std::swap(rank[i - 1], rank[rng.next() % i]);
      bias.resize(rank.size());
      for (size_t e = 0; e < rank.size(); ++e)
        bias[e] = float(-route_skew * std::log(double(rank[e] + 1)) / (double(c.hidden) * c_lean));
    }
  }

  void fill(const SynthTensor& t, uint64_t index, std::span<uint8_t> out) {
    const TypeTraits& type = traits(t.type);
    const int64_t row_len = t.spec.ne[0];
    const int64_t rows = int64_t(t.bytes / row_bytes(t.type, row_len));
    const RowLaw law = law_for(t.spec);
    const uint64_t seed = mix(seed_, index + 1);
    const size_t rb = row_bytes(t.type, row_len);
    if (law.kind == RowLaw::router || t.bytes <= kPoolBytes) {
      draw_rows(law, skew_, t.spec.block, type, row_len, rows, seed, out.data());
      return;
    }
    const std::vector<uint8_t>& pool = pool_for(t, law, row_len, rows);
    const int64_t n_pool = int64_t(pool.size() / rb);
    const int64_t offset = int64_t(Rng{seed}.next() % uint64_t(n_pool));
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(out.data() + size_t(r) * rb, pool.data() + size_t((r + offset) % n_pool) * rb, rb);
  }

private:
  const std::vector<uint8_t>& pool_for(const SynthTensor& t, const RowLaw& law, int64_t row_len,
                                       int64_t rows) {
    const std::string key = fmt::format("{}/{}/{}/{}/{}", int(t.type), row_len, int(law.kind),
                                        law.a, law.b);
    auto& pool = pools_[key];
    if (pool.empty()) {
      const size_t rb = row_bytes(t.type, row_len);
      int64_t n = std::max<int64_t>(1, int64_t(kPoolBytes / rb)) | 1;
      n = std::min(n, rows);
      pool.resize(size_t(n) * rb);
      draw_rows(law, skew_, t.spec.block, traits(t.type), row_len, n, mix(seed_, pools_.size()),
                pool.data());
    }
    return pool;
  }

  uint64_t seed_;
  Skew skew_;
  std::map<std::string, std::vector<uint8_t>> pools_;
};

}  // namespace

std::vector<std::filesystem::path> write_synth(const std::filesystem::path& out,
                                               const SynthOptions& o) {
  Qwen35MoeConfig config = synth_config(o.preset, o.layers, o.mtp);
  std::optional<nlohmann::json> tokenizer_json;
  if (!o.tokenizer_json.empty()) {
    tokenizer_json = tokenizer::read_tokenizer_json(o.tokenizer_json);
    // The embedding grows to hold the tokenizer (rounded up to 64 rows, as real models pad).
    config.vocab = std::max(config.vocab, (tokenizer::hf_token_count(*tokenizer_json) + 63) / 64 * 64);
  }
  const Recipe& recipe = find_recipe(o.recipe);
  if (o.route_skew < 0) fail("--route-skew {}: must be 0 or more", o.route_skew);
  gguf::Writer writer(gguf::WriteOptions{.max_file_bytes = o.max_file_bytes});
  write_config(config, writer.metadata());
  writer.set("general.name", gguf::Value(fmt::format("lode synth {} ({})", o.preset, recipe.name)));
  writer.set("general.file_type", gguf::Value(recipe.file_type));
  writer.set("general.quantization_version", gguf::Value(uint32_t(2)));
  writer.set("lode.synth.preset", gguf::Value(o.preset));
  writer.set("lode.synth.recipe", gguf::Value(recipe.name));
  writer.set("lode.synth.route_skew", gguf::Value(float(o.route_skew)));
  writer.set("lode.synth.seed", gguf::Value(uint64_t(o.seed)));
  if (o.zeros) writer.set("lode.synth.zeros", gguf::Value(true));
  if (tokenizer_json)
    tokenizer::store_hf_tokenizer(*tokenizer_json, config.vocab, writer.metadata());
  else
    write_synth_vocab(config.vocab, writer.metadata());

  auto plan = std::make_shared<std::vector<SynthTensor>>(synth_plan(config, recipe));
  auto maker = std::make_shared<WeightMaker>(config, o.route_skew, o.seed);
  for (size_t i = 0; i < plan->size(); ++i) {
    const SynthTensor& t = (*plan)[i];
    writer.add_tensor(t.spec.name, t.type, t.spec.ne,
                      [plan, maker, i, &o](std::span<uint8_t> dst) {
                        if (o.zeros) std::fill(dst.begin(), dst.end(), uint8_t(0));
                        else maker->fill((*plan)[i], i, dst);
                        if (o.on_tensor) o.on_tensor(i, plan->size(), (*plan)[i].spec.name);
                      });
  }
  return writer.write(out);
}

}  // namespace lode::model
