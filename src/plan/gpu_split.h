// How a model spreads over several GPUs of one host (issue 20), computed from the file alone: each
// GPU takes a contiguous range of layers, with their trunk, K/V cells and DeltaNet states, and a
// decode and a prompt scratch of its own (each as large as one GPU's: counted high for all but
// the last); the last GPU also the output norm and the lm head, and with options.mtp the MTP block
// and its K/V cache (the drafter runs there, beside the lm head it shares). The cut loads the GPUs as evenly
// as a contiguous cut can against the room each has besides its scratch (and the head); the
// prompt chunk halves while the GPUs cannot hold it, as on one GPU. Then whole experts fill the
// GPUs' room, no expert on two GPUs (together they hold as many distinct experts as they have
// slots for): the most wanted first, each on its own layer's GPU while that has room, else on the
// GPU with the most room left that its layer's GPU can read (peer access; cuda/pipeline.h reads
// such lent experts there in place). Every expert stays in host RAM as on one GPU. One GPU gives
// plan_memory's figures.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "plan/memory_plan.h"

namespace lode::plan {

struct GpuShare {
  size_t budget = 0;
  int64_t first_layer = 0, end_layer = 0;  // its layers: [first_layer, end_layer)
  size_t trunk = 0;    // its layers' trunk (and the head and MTP block, on the last GPU)
  size_t kv = 0;       // its attention layers' cells and a page table, all sequences (and the MTP block's)
  size_t states = 0;   // its DeltaNet layers' states, all sequences
  size_t scratch = 0;  // the decode step's and the prompt pass's
  int64_t experts = 0;  // experts it holds
  size_t fixed() const { return trunk + kv + states + scratch; }
};

struct GpuSplit {
  std::vector<GpuShare> gpus;
  int64_t prompt_chunk = 0;    // after halving to fit (0: prompts token by token)
  size_t slot_bytes = 0;       // one expert's slot, as on one GPU
  int64_t experts_total = 0;
  // owner[layer * n_experts + expert]: the GPU holding that expert, -1 where it is in host RAM only.
  std::vector<int32_t> owner;
  int64_t experts_resident() const;
};

// The split for one budget per GPU (options.budget is not used; max_resident_experts caps the
// experts of all GPUs together). scores [layers][n_experts] say which experts are wanted most (a
// routing profile); empty: the first expert of every layer, then the second, ... (an even spread).
// reachable [gpu][gpu]: 1 where the first GPU can read the second's memory (empty: every pair).
// Fails (lode::Error) when no cut lets every GPU hold its layers and scratch at the smallest
// prompt chunk, naming the GPU left shortest and by how many MiB, or when there are more GPUs
// than layers.
GpuSplit split_over_gpus(const model::ModelWeights& weights, const PlanOptions& options,
                         std::span<const size_t> budgets, std::span<const double> scores = {},
                         std::span<const uint8_t> reachable = {});

// Where each GPU's range of layers ends (ends[g]), for layer costs and each GPU's room: the cut
// whose most loaded GPU carries the smallest share of its room (`load`; the cut fits where load
// <= 1), by dynamic programming over (GPUs, layers). Each GPU takes at least one layer.
struct LayerCut {
  std::vector<int64_t> ends;
  double load = 0.0;
};
LayerCut cut_layers(std::span<const size_t> costs, std::span<const double> room);

// The plan options of GPU `gpu`'s share: its budget and the split's prompt chunk, the head and the
// MTP block (options.mtp) on the last GPU only. plan_memory on model::layer_share's weights for its layers and these options gives
// the GPU's trunk, K/V, states and scratch (its scratch at most the split's); the experts it holds
// for other GPUs' layers come on top (cuda/pipeline.h).
PlanOptions share_options(const GpuSplit& split, const PlanOptions& options, size_t gpu);

// Lines for `lode plan --gpus N`: one per GPU, then the experts' total.
std::string describe(const GpuSplit& split);

}  // namespace lode::plan
