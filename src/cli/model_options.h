// Options shared by the commands that run a model (logits, run, chat, ppl): the model path, the
// prompt (token ids or text), threads, context and K/V cache format, and the parsing of "1,2,3"
// token lists.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/session.h"
#include "kv/format.h"

namespace lode::cli {

struct ModelRunOptions {
  std::string model;
  std::string tokens;  // "1,2,3"
  std::string prompt;  // text (-p)
  std::string prompt_file;
  int threads = 0;     // 0: OpenMP's default (all cores)
  int64_t ctx = 0;     // 0: the model's context length
  int64_t chunk = 64;  // prompt tokens per forward chunk
  std::string activations;  // --activations f32|q8; empty: the backend's default
  std::string kv;           // --kv; empty: LODE_KV, else fp16

  // The --activations choice, or the backend's default when none was given (CPU: f32, GPU: q8).
  model::Activations activations_or(model::Activations fallback) const;
  kv::Format kv_format() const;
  cpu::SessionOptions session_options() const {
    return {.threads = threads, .max_context = ctx, .activations = activations_or(model::Activations::f32),
            .kv_format = kv_format()};
  }
};

// Adds --kv (the K/V cache format) to a command.
void add_kv_option(CLI::App& cmd, std::string& kv);
// The format for a --kv value: the flag when given, else the environment's LODE_KV, else fp16.
// Fails naming the valid formats.
kv::Format chosen_kv_format(const std::string& flag);

enum class PromptInput { none, token_ids, ids_or_text };
void add_model_run_options(CLI::App& cmd, ModelRunOptions& o, PromptInput prompt);
// The prompt's text from -p or --file (empty when neither was given).
std::string read_prompt_text(const ModelRunOptions& o);
// "1, 2,3" or "1 2 3" (what lode tokenize prints) -> {1, 2, 3}; fails on anything that is not a
// list of ids, naming `option`, the flag that gave it.
std::vector<int32_t> parse_token_list(const std::string& text, const char* option = "--tokens");

}  // namespace lode::cli
