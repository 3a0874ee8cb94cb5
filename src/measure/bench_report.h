// What `lode bench` measured and how it is written: the figures of one VRAM budget's runs beside
// the device's limits measured in the same process, as text for people or as one JSON object per
// budget for scripts. No CUDA here, so the report is tested on any machine.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plan/memory_plan.h"

namespace lode::measure {

// What the expert tier did during a measured run, per token (decode) or per prompt (prefill).
struct TierFigures {
  double hit_rate = 1.0;
  double pcie_bytes = 0;  // expert bytes read over PCIe
  double cpu_experts = 0, cpu_bytes = 0, cpu_seconds = 0;  // decode misses the CPU computed, their bytes, its time
  double cpu_hinted = 0, cpu_read_ahead = 0;  // of cpu_experts, those hinted; the bytes read ahead on hints
  double gpu_share_seconds = 0, host_wait_seconds = 0;  // per CPU request: the GPU's own share, then its wait
  int64_t swaps = 0;
};

struct PrefillFigures {
  int64_t tokens = 0;
  double tokens_per_s = 0, tflops = 0;
  TierFigures tier;  // per prompt
};

struct DecodeFigures {
  int64_t depth = 0;
  double tokens_per_s = 0, bytes_per_token = 0, gbps = 0;
  TierFigures tier;  // per token
};

// Tokens a verify window of `tokens` tokens yields on average when each draft is accepted with
// probability `acceptance` (independently, until the first rejection): 1 + a + ... + a^(tokens - 1).
double window_tokens_at(int64_t tokens, double acceptance);

// Verify windows at a depth (speculative decoding's step: `tokens` tokens in one step), against the
// one-token step measured at the same depth.
struct WindowFigures {
  int64_t depth = 0, tokens = 0;
  double seconds = 0;     // per window
  double step_ratio = 0;  // seconds over the one-token step's
  TierFigures tier;       // per window
  double tokens_at(double acceptance) const { return window_tokens_at(tokens, acceptance); }
};

// Steps of several sequences at a depth (serving: every sequence's next token in one step), against
// the one-token step of one sequence measured at the same depth; with `window` > 1, every
// sequence's verify window of that many tokens in one step (serving with drafts), against the step
// of one token each of as many sequences too.
struct SequencesFigures {
  int64_t depth = 0, sequences = 0, window = 1;
  double seconds = 0;      // per step
  double step_ratio = 0;   // seconds over the one-token step's
  double plain_ratio = 0;  // with windows: seconds over the step of one token each
  // With windows, on a model with an MTP block: the drafts of one such step (window - 1 steps of the
  // block over a row of each sequence, as the GPU server drafts them); 0: not timed.
  double draft_seconds = 0;
  // The drafts in steps of one token each, as plain_ratio counts the step.
  double draft_ratio() const { return seconds > 0 ? draft_seconds / seconds * plain_ratio : 0; }
  TierFigures tier;        // per step
  double tokens_per_s() const { return seconds > 0 ? double(sequences) / seconds : 0; }  // all sequences'
};

// Prompts of several sequences read together (serving: requests' prompts arriving at once): `prompts`
// prompts of `tokens` tokens each, from empty sequences, in passes of the prompt path that take as
// many as fit, against one prompt at a time (the prefill of that length in the same run).
struct PiecesFigures {
  int64_t tokens = 0, prompts = 0, passes = 0;
  double seconds = 0;                // for all of them
  double alone_tokens_per_s = 0;     // one prompt at a time
  TierFigures tier;                  // per prompt
  double tokens_per_s() const { return seconds > 0 ? double(tokens * prompts) / seconds : 0; }
};

// The device's limits, measured once per process, in memory of their own (outside lode's budget).
struct Ceilings {
  double copy_gbps = 0, bf16_tflops = 0, tf32_tflops = 0;
  double pcie_copy_gbps = 0, pcie_mapped_gbps = 0;  // host to device: the copy engine, kernels reading in place
};

// One VRAM budget's runs and what they ran on.
struct BenchRun {
  std::string model;     // the path as given
  std::string kv;        // the K/V format's name
  std::string fill;      // how decode depths were reached: "prompt" or "random"
  int64_t generated = 0;  // tokens decoded per timed run
  int repeats = 0;        // timed runs per figure
  std::vector<PrefillFigures> prefills;
  std::vector<DecodeFigures> decodes;
  std::vector<WindowFigures> windows;
  std::vector<SequencesFigures> sequences;
  std::vector<PiecesFigures> pieces;
  double load_s = 0, peak_mib = 0, weights_mib = 0;
  int64_t prompt_chunk = 0, context = 0;
  plan::MemoryPlan plan;  // on several GPUs, their plans together (plan::together)
  std::string layout;     // on several GPUs, each one's layers and plan (empty on one)
  std::string host_tier;  // how host RAM holds the experts
  std::string miss_path;  // who computes decode misses
};

nlohmann::json to_json(const Ceilings& c, const BenchRun& b);
std::string to_text(const Ceilings& c, const BenchRun& b);
std::string ceilings_text(const Ceilings& c);

}  // namespace lode::measure
