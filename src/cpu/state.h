// What one sequence carries from token to token: the K/V cache of every full-attention layer and
// the conv + recurrent state of every Gated DeltaNet layer (float32).
#pragma once
#include <cstdint>
#include <vector>

#include "cpu/kv_cache.h"
#include "kv/format.h"
#include "model/qwen35moe.h"

namespace lode::cpu {

// One DeltaNet layer's state.
struct DeltaNetState {
  std::vector<float> conv;   // [channels][kernel - 1]: the last kernel-1 inputs, oldest first
  std::vector<float> s;      // [Hv][dk][dv]: recurrent state per value head (GGUF slot order)
};

struct SequenceState {
  int64_t position = 0;                 // tokens seen so far
  std::vector<KvCache> kv;              // per layer (empty for DeltaNet layers)
  std::vector<DeltaNetState> deltanet;  // per layer (empty for attention layers)

  // Fresh state for a model: zero conv and recurrent states, empty caches in `kv_format`.
  SequenceState(const model::Qwen35MoeConfig& config, kv::Format kv_format);
};

// What it takes to go back to an earlier position of the same sequence. K/V caches only grow, so
// cutting them back is enough; the DeltaNet states cannot be rolled back and are copied whole (a
// few MiB at most per sequence, independent of the position).
struct SequenceCheckpoint {
  int64_t position = 0;
  std::vector<DeltaNetState> deltanet;

  int64_t bytes() const;  // the memory the checkpoint holds
};

}  // namespace lode::cpu
