#include "model/recipe.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <utility>

#include "core/error.h"

namespace lode::model {
namespace {

using R = TensorRole;

// Roles that stay F32 in every quantized file (llama.cpp reads them as F32: small, and the
// forward pass wants them exact).
bool always_f32(TensorRole role) {
  switch (role) {
    case R::norm: case R::router: case R::shared_gate_inp: case R::ssm_conv: case R::ssm_a:
    case R::ssm_dt:
      return true;
    default:
      return false;
  }
}

bool is_attention_or_delta_net(TensorRole role) {
  switch (role) {
    case R::attn_q: case R::attn_k: case R::attn_v: case R::attn_output: case R::ssm_qkv:
    case R::ssm_gate: case R::ssm_beta: case R::ssm_alpha: case R::ssm_out: case R::mtp_eh_proj:
      return true;
    default:
      return false;
  }
}

bool is_shared_expert(TensorRole role) {
  return role == R::shared_gate || role == R::shared_up || role == R::shared_down;
}

GgmlType pick_f32(TensorRole, int64_t, int64_t) { return GgmlType::F32; }

GgmlType pick_f16(TensorRole role, int64_t, int64_t) {
  return always_f32(role) ? GgmlType::F32 : GgmlType::F16;
}

GgmlType pick_q8_0(TensorRole role, int64_t, int64_t) {
  return always_f32(role) ? GgmlType::F32 : GgmlType::Q8_0;
}

// llama.cpp's "use more bits" rule for Q4_K_M: the first and last eighth of the blocks, and every
// third block in between.
bool more_bits(int64_t block, int64_t n_blocks) {
  if (block < 0 || n_blocks <= 0) return false;
  return block < n_blocks / 8 || block >= 7 * n_blocks / 8 || (block - n_blocks / 8) % 3 == 2;
}

GgmlType pick_q4_k_m(TensorRole role, int64_t block, int64_t n_blocks) {
  if (always_f32(role)) return GgmlType::F32;
  if (role == R::output) return GgmlType::Q6_K;
  if (role == R::attn_v || role == R::expert_down || role == R::shared_down)
    return more_bits(block, n_blocks) ? GgmlType::Q6_K : GgmlType::Q4_K;
  return GgmlType::Q4_K;
}

// Unsloth UD-Q4_K_XL-like: routed experts at 4-5 bits (they are ~90% of the bytes), the dense
// trunk every token touches at 8 bits.
GgmlType pick_ud_q4_k_xl(TensorRole role, int64_t, int64_t) {
  if (always_f32(role)) return GgmlType::F32;
  if (role == R::expert_gate || role == R::expert_up) return GgmlType::Q4_K;
  if (role == R::expert_down) return GgmlType::Q5_K;
  if (role == R::embedding || role == R::output) return GgmlType::Q6_K;
  if (is_attention_or_delta_net(role) || is_shared_expert(role)) return GgmlType::Q8_0;
  return GgmlType::Q8_0;
}

std::string normalized(std::string_view name) {
  std::string s(name);
  for (char& c : s) c = c == '_' ? '-' : char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The next type down when `type`'s block does not divide a row.
std::optional<GgmlType> fallback(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_K: return GgmlType::Q4_0;
    case GgmlType::Q5_K: return GgmlType::Q5_0;
    case GgmlType::Q6_K: return GgmlType::Q8_0;
    case GgmlType::Q4_0: case GgmlType::Q5_0: return GgmlType::Q8_0;
    case GgmlType::Q8_0: return GgmlType::F16;
    case GgmlType::F16: return GgmlType::F32;
    default: return std::nullopt;
  }
}

}  // namespace

const std::vector<Recipe>& all_recipes() {
  static const std::vector<Recipe> recipes = {
      {"f32", "everything float32", pick_f32, 0},
      {"f16", "matrices float16; norms, router, conv, ssm_a, ssm_dt float32", pick_f16, 1},
      {"q8_0", "matrices Q8_0; norms, router, conv, ssm_a, ssm_dt float32", pick_q8_0, 7},
      {"q4_k_m",
       "llama.cpp Q4_K_M-like: Q4_K; output Q6_K; attn_v and expert/shared down Q6_K in the first "
       "and last eighth and every third block, else Q4_K",
       pick_q4_k_m, 15},
      {"ud-q4_k_xl",
       "UD-Q4_K_XL-like: expert gate/up Q4_K, expert down Q5_K, attention/DeltaNet/shared-expert "
       "projections Q8_0, embeddings/output Q6_K, norms/router/conv/ssm_a/ssm_dt F32",
       pick_ud_q4_k_xl, 15},  // llama.cpp calls UD-Q4_K_XL files Q4_K_M
  };
  return recipes;
}

const Recipe& find_recipe(std::string_view name) {
  const std::string want = normalized(name);
  std::string names;
  for (const Recipe& r : all_recipes()) {
    if (normalized(r.name) == want) return r;
    names += (names.empty() ? "" : ", ") + r.name;
  }
  fail("no recipe named \"{}\" (recipes: {})", name, names);
}

GgmlType recipe_type(const Recipe& recipe, const TensorSpec& spec, int64_t n_blocks) {
  if (spec.ne.size() < 2) return GgmlType::F32;
  GgmlType type = recipe.pick(spec.role, spec.block, n_blocks);
  while (spec.ne[0] % traits(type).block_size != 0) {
    const auto next = fallback(type);
    if (!next) return GgmlType::F32;
    type = *next;
  }
  return type;
}

std::optional<NamedRole> role_from_name(std::string_view name) {
  int64_t block = -1;
  if (name.starts_with("blk.")) {
    name.remove_prefix(4);
    const auto dot = name.find('.');
    if (dot == std::string_view::npos) return std::nullopt;
    const auto [end, ec] = std::from_chars(name.data(), name.data() + dot, block);
    if (ec != std::errc() || end != name.data() + dot) return std::nullopt;
    name.remove_prefix(dot + 1);
  }
  static const std::pair<std::string_view, TensorRole> table[] = {
      {"token_embd.weight", R::embedding}, {"output.weight", R::output},
      {"output_norm.weight", R::norm}, {"attn_norm.weight", R::norm},
      {"post_attention_norm.weight", R::norm}, {"attn_q_norm.weight", R::norm},
      {"attn_k_norm.weight", R::norm}, {"ssm_norm.weight", R::norm},
      {"nextn.enorm.weight", R::norm}, {"nextn.hnorm.weight", R::norm},
      {"nextn.shared_head_norm.weight", R::norm}, {"nextn.eh_proj.weight", R::mtp_eh_proj},
      {"ffn_gate_inp.weight", R::router}, {"ffn_gate_exps.weight", R::expert_gate},
      {"ffn_up_exps.weight", R::expert_up}, {"ffn_down_exps.weight", R::expert_down},
      {"ffn_gate_inp_shexp.weight", R::shared_gate_inp}, {"ffn_gate_shexp.weight", R::shared_gate},
      {"ffn_up_shexp.weight", R::shared_up}, {"ffn_down_shexp.weight", R::shared_down},
      {"attn_q.weight", R::attn_q}, {"attn_k.weight", R::attn_k}, {"attn_v.weight", R::attn_v},
      {"attn_output.weight", R::attn_output}, {"attn_qkv.weight", R::ssm_qkv},
      {"attn_gate.weight", R::ssm_gate}, {"ssm_beta.weight", R::ssm_beta},
      {"ssm_alpha.weight", R::ssm_alpha}, {"ssm_out.weight", R::ssm_out},
      {"ssm_conv1d.weight", R::ssm_conv}, {"ssm_a", R::ssm_a}, {"ssm_dt.bias", R::ssm_dt},
  };
  for (const auto& [suffix, role] : table) {
    const bool top_level = role == R::embedding || role == R::output || suffix == "output_norm.weight";
    if (name == suffix && top_level == (block < 0)) return NamedRole{role, block};
  }
  return std::nullopt;
}

}  // namespace lode::model
