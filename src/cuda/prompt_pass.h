// The prompt path of the CUDA session: a chunk of tokens goes through every layer at once, the
// dense matrix products on tensor cores (cuda/gemm.h) over weights expanded to float32 per chunk
// (cuda/dequant.h), the experts' rows grouped by expert and multiplied on tensor cores straight
// from the experts' stored bytes (cuda/expert_products.h), each expert read from its VRAM slot or,
// when absent, from a staging buffer the copy engine fills from pinned host RAM while the previous
// group of plan::kPromptExpertGroup multiplies, the
// DeltaNet recurrence scanned over the chunk with its state in registers, and prompt attention as
// two batched products around a causal softmax. K/V rows and DeltaNet states end as token-by-token
// decoding would leave them (to float rounding; exactly so for the conv states).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/device_model.h"
#include "cuda/gemm.h"
#include "model/qwen35moe.h"
#include "model/weights.h"

namespace lode::cuda {

class ExpertTier;
class VramAccountant;

struct PromptPassOptions {
  int64_t chunk = 2048;        // tokens per pass: scratch grows with it (about 350 KB a token for 35B-A3B)
  int64_t max_context = 4096;  // the K/V length attention may span
  PromptMath math = PromptMath::tf32;
  bool profile = false;  // wait for the GPU between phases and book their time (see profile())
  // A share of the layers on several GPUs whose rows come from the share before, normed
  // (CudaSessionOptions::hand_in): the chunk starts from input_rows() and normed_rows().
  bool hand_in = false;
};

class PromptPass {
 public:
  // Allocates the pass's scratch (through `vram`, as scratch: plan::prompt_scratch) for
  // options.chunk tokens. `layers` and `tier` must outlive the pass.
  PromptPass(const model::ModelWeights& weights, const std::vector<DeviceLayer>& layers, const ExpertTier& tier,
             const float* output_norm, VramAccountant& vram, PromptPassOptions options, void* stream);
  ~PromptPass();
  PromptPass(const PromptPass&) = delete;
  PromptPass& operator=(const PromptPass&) = delete;

  // Where the caller puts the embeddings of the chunk, [chunk][hidden] (device memory).
  float* input_rows();
  // Where each row's h is normed, [chunk][hidden]: with options.hand_in, where the caller puts
  // the normed rows beside input_rows(); after a chunk, output_rows().
  float* normed_rows();
  // Runs n <= chunk tokens of the sequence whose layers' state is `sequence` at positions first,
  // first + 1, ... (*device_first == first, on the device: attention's K/V rows are written there).
  // Afterwards output_rows() holds each token's final hidden state after the output norm,
  // [n][hidden], ready for the lm head (on a share of the layers that hands its rows on, `output_norm`
  // is the next share's first norm, and input_rows() holds each row's h for it).
  void run(const std::vector<LayerState>& sequence, int64_t n, const int64_t* device_first, int64_t first);
  const float* output_rows() const;
  // The two staging buffers of staging_bytes() each (plan::PromptScratch), idle between chunks:
  // decode steps stage their GPU-computed misses there (kernels::MissStage).
  uint8_t* staging(int buffer) const;
  size_t staging_bytes() const;
  int64_t chunk() const;
  // Expert bytes the chunks so far read over PCIe (each absent expert a chunk routes to, once).
  uint64_t miss_bytes() const;
  // With options.profile: seconds spent so far per phase ("expanding weights", ...).
  std::vector<std::pair<std::string, double>> profile() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lode::cuda
