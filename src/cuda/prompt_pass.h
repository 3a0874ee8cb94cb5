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
#include <span>
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

// One sequence's rows in a pass (PromptPass::run): `rows` tokens at positions first, first + 1, ...
// (*device_first == first, on the device: attention's K/V rows are written there), at rows
// [start, start + rows) of the pass's buffers.
struct PromptSegment {
  const std::vector<LayerState>* states = nullptr;  // the sequence's layers' state
  int64_t rows = 0;
  int64_t start = 0;
  const int64_t* device_first = nullptr;
  int64_t first = 0;
};

// Several sequences' prompt pieces share a pass so that it reads each layer's weights once for
// all of them; every product still runs per sequence, on that sequence's rows alone, except the
// experts' (whose rows are independent of each other), and each sequence's rows start on a
// multiple of kPromptRowAlign rows: every product then sees the shapes and the pointer alignment a
// pass of that sequence alone sees, so cuBLAS takes the same algorithm and the rows get the same
// bits as alone. The rows between pieces are padding, left out of the experts.
constexpr int64_t kPromptRowAlign = 64;
// Where pieces of these lengths start in one pass, in order, and then where the last ends: the
// rows the pass spans, padding included (at most the chunk).
std::vector<int64_t> prompt_row_starts(std::span<const int64_t> lengths);

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
  // Runs the segments' rows (distinct sequences, starts as prompt_row_starts gives them, ending
  // within the chunk; one segment: a chunk of one sequence, at row 0). Afterwards output_rows()
  // holds each row's final hidden state after the output norm, [rows][hidden], ready for the lm
  // head (on a share of the layers that hands its rows on, `output_norm` is the next share's first
  // norm, and input_rows() holds each row's h for it).
  void run(std::span<const PromptSegment> segments);
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
