// Host sampling of one row of Qwen3.6's 248,320 logits (what the server does for every sampled
// request at every step, beside the model's step): the server's defaults (temperature, top-k 20,
// top-p 0.95), a wider top-k, top-p alone, min-p alone and greedy; on logits drawn from a normal
// distribution (flat: top-p keeps thousands) and on peaked ones (a few tokens carry the mass, as a
// model's usually do). Also the mask of a reply constrained to JSON (sample/json_tokens.h) over as
// many made-up tokens. Results: docs/BENCHMARKS.md.
//
//   build/bench_sampler --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sample/json_schema.h"
#include "sample/json_tokens.h"
#include "sample/logprobs.h"
#include "sample/sampler.h"

namespace {

constexpr int64_t kVocab = 248320;

std::vector<float> logits(bool peaked) {
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, peaked ? 1.0f : 2.5f);
  std::vector<float> l(kVocab);
  for (float& x : l) x = normal(gen);
  if (peaked)
    for (int i = 0; i < 8; ++i) l[size_t(gen() % kVocab)] += 14.0f - float(i);
  return l;
}

void run(benchmark::State& state, lode::sample::SamplingParams params, bool peaked) {
  const std::vector<float> row = logits(peaked);
  lode::sample::Sampler sampler(std::move(params), kVocab);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(row));
}

lode::sample::SamplingParams with(float temperature, int top_k, float top_p, float min_p) {
  return {.temperature = temperature, .top_k = top_k, .top_p = top_p, .min_p = min_p, .seed = 7};
}

// A made-up vocabulary of kVocab tokens shaped like a byte-level BPE one (words with and without a
// leading space, digits, punctuation runs, a few quotes and brackets), for the JSON mask.
std::vector<std::string> made_up_vocabulary() {
  std::mt19937 gen(3);
  const std::string letters = "etaoinshrdlucmfwypvbgkjqxz", punctuation = ".,:;!?-()[]{}\"'/\\_=+*<>#@&%$";
  std::vector<std::string> v;
  for (int c = 0; c < 256; ++c) v.emplace_back(1, char(c));
  while (v.size() < size_t(kVocab)) {
    const unsigned kind = gen() % 100;
    std::string t;
    if (kind < 85) {  // a word piece, most with a leading space
      if (gen() % 3 != 0) t = " ";
      for (unsigned n = 1 + gen() % 9; n > 0; --n) t += letters[std::min<size_t>(gen() % 40, letters.size() - 1)];
    } else if (kind < 92) {
      for (unsigned n = 1 + gen() % 4; n > 0; --n) t += char('0' + gen() % 10);
    } else {
      for (unsigned n = 1 + gen() % 3; n > 0; --n) t += punctuation[gen() % punctuation.size()];
    }
    v.push_back(std::move(t));
  }
  return v;
}

const lode::sample::JsonTokens& json_tokens() {
  static const std::vector<std::string> vocabulary = made_up_vocabulary();
  static const lode::sample::JsonTokens tokens(std::vector<std::string_view>(vocabulary.begin(), vocabulary.end()),
                                               std::vector<bool>(vocabulary.size(), false));
  return tokens;
}

// The mask of a reply constrained to JSON over kVocab tokens, from a state inside a string (most
// of a JSON reply), where a value must come, and inside a number.
void json_mask(benchmark::State& state, const char* prefix) {
  lode::sample::JsonPrefix text;
  text.push(std::string_view(prefix));
  std::vector<uint8_t> allowed;
  for (auto _ : state) {
    json_tokens().mark(text, allowed);
    benchmark::DoNotOptimize(allowed.data());
  }
}

// The same for a reply constrained to a schema (sample/json_schema.h): its properties' keys, an
// enum, a free string, an array of integers.
void json_schema_mask(benchmark::State& state, const char* prefix) {
  static const auto schema = lode::sample::JsonSchema::compile(nlohmann::json::parse(R"({"type": "object",
      "properties": {"name": {"type": "string"}, "kind": {"enum": ["file", "directory", "link"]},
                     "sizes": {"type": "array", "items": {"type": "integer"}}},
      "required": ["name", "kind"]})"));
  lode::sample::SchemaPrefix text(*schema);
  if (!text.push(std::string_view(prefix))) state.SkipWithError("the prefix is not the schema's");
  std::vector<uint8_t> allowed;
  for (auto _ : state) {
    json_tokens().mark(text, allowed);
    benchmark::DoNotOptimize(allowed.data());
  }
}

// The same by trying every token's bytes from the state: what the walk replaces.
void json_mask_trying_each(benchmark::State& state, const char* prefix) {
  static const std::vector<std::string> vocabulary = made_up_vocabulary();
  lode::sample::JsonPrefix text;
  text.push(std::string_view(prefix));
  std::vector<uint8_t> allowed(vocabulary.size());
  for (auto _ : state) {
    for (size_t id = 0; id < vocabulary.size(); ++id) {
      lode::sample::JsonPrefix tried = text;
      allowed[id] = tried.push(vocabulary[id]);
    }
    benchmark::DoNotOptimize(allowed.data());
  }
}

// A reply's logprobs at one token (sample/logprobs.h): the row's log-softmax there and its 20 best.
void logprobs(benchmark::State& state) {
  const std::vector<float> row = logits(true);
  for (auto _ : state) benchmark::DoNotOptimize(lode::sample::token_logprobs(row, 7, 20));
}

}  // namespace

BENCHMARK(logprobs)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(json_mask_trying_each, in_a_string, "{\"name\": \"lode")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(json_mask_trying_each, a_value_next, "{\"name\": ")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(json_mask, in_a_string, "{\"name\": \"lode")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(json_mask, a_value_next, "{\"name\": ")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(json_mask, in_a_number, "{\"sizes\": [1, 25")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(json_schema_mask, in_a_string, "{\"name\": \"lode")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(json_schema_mask, a_key_next, "{\"name\": \"lode\", ")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(json_schema_mask, an_enum_next, "{\"kind\": ")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(json_schema_mask, in_a_number, "{\"sizes\": [1, 25")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(run, server_defaults_flat, with(0.7f, 20, 0.95f, 0.0f), false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(run, server_defaults_peaked, with(0.7f, 20, 0.95f, 0.0f), true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(run, top_k_200_peaked, with(0.7f, 200, 1.0f, 0.0f), true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(run, top_p_only_peaked, with(0.7f, 0, 0.95f, 0.0f), true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(run, min_p_only_peaked, with(0.7f, 0, 1.0f, 0.05f), true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(run, greedy, with(0.0f, 0, 1.0f, 0.0f), true)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
