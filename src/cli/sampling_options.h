// The sampling flags shared by `lode run` and `lode chat`, with Qwen's recommended defaults for
// thinking mode (temperature 0.6, top-k 20, top-p 0.95).
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "sample/sampler.h"

namespace lode::cli {

struct SamplingCliOptions {
  sample::SamplingParams params;
  std::string logit_bias;        // "id:bias,id:bias"
  std::optional<uint64_t> seed;  // unset: a fresh random seed, reported so a run can be repeated
};

void add_sampling_options(CLI::App& cmd, SamplingCliOptions& o);

// Speculative decoding with the model's MTP block (engine::GenerateOptions::mtp).
struct DraftCliOptions {
  int64_t mtp = 0;     // drafts per verify step; 0: off
  float min_p = 0.0f;  // stop drafting below this confidence
};
void add_draft_options(CLI::App& cmd, DraftCliOptions& o);

// The parameters with the bias list parsed, the seed chosen, and everything validated.
sample::SamplingParams sampling_params(const SamplingCliOptions& o, int64_t n_vocab);

}  // namespace lode::cli
