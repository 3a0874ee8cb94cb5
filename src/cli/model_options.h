// Options shared by the commands that run a model (logits, run): the model path, the token ids,
// threads and context, and the parsing of "1,2,3" token lists.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace lode::cli {

struct ModelRunOptions {
  std::string model;
  std::string tokens;  // "1,2,3"
  int threads = 0;     // 0: OpenMP's default (all cores)
  int64_t ctx = 0;     // 0: the model's context length
  int64_t chunk = 64;  // prompt tokens per forward chunk
};

void add_model_run_options(CLI::App& cmd, ModelRunOptions& o);
// "1, 2,3" -> {1, 2, 3}; fails on anything that is not a comma-separated list of ids.
std::vector<int32_t> parse_token_list(const std::string& text);

}  // namespace lode::cli
