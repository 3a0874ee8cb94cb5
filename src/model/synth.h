// `lode synth`: writes a qwen35moe GGUF with a preset's exact geometry and metadata, random but
// valid (and numerically sane) weights in a recipe's per-tensor types, a byte-level BPE vocabulary
// llama.cpp accepts, an optional MTP block, and optionally skewed routers (docs/SYNTH.md).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/quant/types.h"
#include "gguf/metadata.h"
#include "model/qwen35moe.h"
#include "model/recipe.h"

namespace lode::model {

struct SynthOptions {
  std::string preset = "tiny";         // "qwen3.6-35b-a3b" or "tiny"
  std::string recipe = "ud-q4_k_xl";
  int64_t layers = 0;                  // main-model layers; 0: the preset's
  bool mtp = false;                    // add the MTP block (one extra block)
  double route_skew = 0;               // Zipf exponent of expert popularity; 0: uniform routing
  uint64_t seed = 1;
  // Every tensor's bytes zero (valid blocks with zero scales): the geometry without weights, for
  // planning and tests; sparse on disk, so even the 35B geometry takes next to no space.
  bool zeros = false;
  uint64_t max_file_bytes = 0;         // split the output (0: one file)
  std::filesystem::path tokenizer_json; // a HF tokenizer.json to embed instead of the synth vocabulary
                                        // (the vocabulary grows to hold it)
  // Called after each tensor: (index, count, name).
  std::function<void(size_t, size_t, const std::string&)> on_tensor;
};

// The preset's config with `layers` main layers (0: the preset's count; layer i is full attention
// iff (i+1) % 4 == 0) and the MTP block when `mtp`. Fails naming the presets.
Qwen35MoeConfig synth_config(const std::string& preset, int64_t layers, bool mtp);

// One tensor as synth writes it.
struct SynthTensor {
  TensorSpec spec;
  GgmlType type;
  uint64_t bytes;
};
// Every tensor of `config` with the recipe's type and its byte size (nothing is generated).
std::vector<SynthTensor> synth_plan(const Qwen35MoeConfig& config, const Recipe& recipe);
uint64_t synth_tensor_bytes(const Qwen35MoeConfig& config, const Recipe& recipe);

// The tokenizer.* keys of a byte-level BPE vocabulary of `vocab` tokens (>= 261): 256 byte tokens,
// merged tokens with their merges, and the qwen35 special tokens (at their real ids 248044..
// when the vocabulary is that big, else at its end).
void write_synth_vocab(int64_t vocab, gguf::Metadata& metadata);

// Writes the model; returns the files written.
std::vector<std::filesystem::path> write_synth(const std::filesystem::path& out,
                                               const SynthOptions& options);

}  // namespace lode::model
