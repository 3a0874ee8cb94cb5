// Quantization recipes: a named rule giving each tensor of a qwen35moe model its ggml type, by the
// tensor's role (expert gate, router, norm, ...). Used by `lode synth --recipe` and
// `lode quantize --recipe`. Recipes: f32, f16, q8_0, q4_k_m (llama.cpp Q4_K_M-like),
// ud-q4_k_xl (Unsloth UD-Q4_K_XL-like).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/quant/types.h"
#include "model/qwen35moe.h"

namespace lode::model {

struct Recipe {
  std::string name;
  std::string summary;  // one line for --help and docs
  // The type a recipe wants for a role in block `block` of `n_blocks` (-1: not in a block).
  GgmlType (*pick)(TensorRole role, int64_t block, int64_t n_blocks);
  uint32_t file_type;   // general.file_type (llama_ftype) a file made with it declares
};

// Every recipe, for listings.
const std::vector<Recipe>& all_recipes();
// The recipe of that name (case-insensitive; "_" and "-" are the same); fails listing the names.
const Recipe& find_recipe(std::string_view name);

// The type `recipe` gives a tensor: its pick, lowered to a type whose block divides the row
// length (ne[0]) when the pick does not (Q4_K -> Q4_0 -> Q8_0 -> F16 ...). 1-D tensors stay F32.
GgmlType recipe_type(const Recipe& recipe, const TensorSpec& spec, int64_t n_blocks);

// The role of a llama.cpp qwen35moe tensor name ("blk.7.ffn_down_exps.weight" -> expert_down) and
// its block (-1 outside blocks); nullopt for names a qwen35moe model does not have.
struct NamedRole {
  TensorRole role;
  int64_t block;
};
std::optional<NamedRole> role_from_name(std::string_view name);

}  // namespace lode::model
