// A synthesized model for a test (model/synth.h) at `path`: the preset's geometry ("tiny" or
// "qwen3.6-35b-a3b"), the recipe's weight types, random weights from `seed`; layers 0: the preset's.
#pragma once
#include <cstdint>
#include <filesystem>

#include "model/synth.h"

namespace lode::test {

inline void synth_model(const std::filesystem::path& path, const char* preset, const char* recipe, uint64_t seed,
                        int layers = 0) {
  model::SynthOptions synth;
  synth.preset = preset;
  synth.recipe = recipe;
  synth.seed = seed;
  if (layers > 0) synth.layers = layers;
  model::write_synth(path, synth);
}

}  // namespace lode::test
