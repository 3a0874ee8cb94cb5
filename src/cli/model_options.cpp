#include "cli/model_options.h"

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>

#include "cli/validators.h"
#include "core/error.h"

namespace lode::cli {

void add_model_run_options(CLI::App& cmd, ModelRunOptions& o, PromptInput prompt) {
  cmd.add_option("-m,--model", o.model, "GGUF model (for a split model: its first file)")->required();
  if (prompt == PromptInput::token_ids) {
    cmd.add_option("--tokens", o.tokens, "Prompt token ids, comma-separated: 1,2,3")->required();
  } else if (prompt == PromptInput::ids_or_text) {
    auto* tokens = cmd.add_option("--tokens", o.tokens, "Prompt token ids, comma-separated: 1,2,3");
    auto* text = cmd.add_option("-p,--prompt", o.prompt, "Prompt text");
    auto* file = cmd.add_option("-f,--file", o.prompt_file, "Read the prompt text from this file (-: standard input)")
                     ->check(file_or_stdin());
    tokens->excludes(text)->excludes(file);
    text->excludes(file);
  }
  cmd.add_option("--threads", o.threads, "CPU threads (default: all cores)")->check(thread_count());
  cmd.add_option("--ctx", o.ctx, "Context length (default: the model's)")->check(integer_at_least(0));
  cmd.add_option("--chunk", o.chunk, "Prompt tokens per forward chunk (default 64)")->check(integer_at_least(1));
  cmd.add_option("--activations", o.activations,
                 "f32: float32 products (the CPU's default); q8: round activations to 8 bits before each "
                 "product with quantized weights, as llama.cpp does (the GPU's default: integer products)")
      ->transform(CLI::IsMember({"f32", "q8"}, CLI::ignore_case));  // "Q8" becomes "q8"
  add_kv_option(cmd, o.kv);
}

void add_kv_option(CLI::App& cmd, std::string& kv) {
  cmd.add_option("--kv", kv,
                 "K/V cache format: fp16 (default), fp32, int8 (also k8v8: 8 bits, a scale per 64 values), k8v32, "
                 "k32v8 (int8 on one side), q4 (4 bits of the Hadamard-rotated head), k8v4 (int8 K, q4 V); the "
                 "environment's LODE_KV when not given (docs/KV.md)")
      ->check(non_empty())
      ->type_name("FORMAT");
}

kv::Format chosen_kv_format(const std::string& flag) { return kv::choose_format(flag, std::getenv("LODE_KV")); }

kv::Format ModelRunOptions::kv_format() const { return chosen_kv_format(kv); }

model::Activations ModelRunOptions::activations_or(model::Activations fallback) const {
  if (activations.empty()) return fallback;
  return activations == "q8" ? model::Activations::q8 : model::Activations::f32;
}

std::string read_prompt_text(const ModelRunOptions& o) {
  if (o.prompt_file.empty()) return o.prompt;
  if (o.prompt_file == "-") return std::string(std::istreambuf_iterator<char>(std::cin), {});
  std::ifstream in(o.prompt_file, std::ios::binary);
  if (!in) fail("cannot read the prompt file {}", o.prompt_file);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<int32_t> parse_token_list(const std::string& text, const char* option) {
  std::vector<int32_t> ids;
  const auto separator = [](char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  bool after_comma = true;  // (a comma must follow an id, and be followed by one)
  for (size_t pos = 0; pos < text.size();) {
    if (separator(text[pos])) {
      if (text[pos] == ',' && after_comma)
        fail("{}: '{}' is not a list of token ids (a comma with no id before it)", option, text);
      after_comma = after_comma || text[pos] == ',';
      ++pos;
      continue;
    }
    after_comma = false;
    size_t end = pos;
    while (end < text.size() && !separator(text[end])) ++end;
    int32_t id = 0;
    const auto [stop, err] = std::from_chars(text.data() + pos, text.data() + end, id);
    if (err != std::errc() || stop != text.data() + end || id < 0)
      fail("{}: '{}' is not a token id (expected non-negative integers, separated by commas or spaces)", option,
           text.substr(pos, end - pos));
    ids.push_back(id);
    pos = end;
  }
  if (ids.empty()) fail("{}: no token ids", option);
  if (after_comma) fail("{}: '{}' ends with a comma", option, text);
  return ids;
}

}  // namespace lode::cli
