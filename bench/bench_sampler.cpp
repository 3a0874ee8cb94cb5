// Host sampling of one row of Qwen3.6's 248,320 logits (what the server does for every sampled
// request at every step, beside the model's step): the server's defaults (temperature, top-k 20,
// top-p 0.95), a wider top-k, top-p alone, min-p alone and greedy; on logits drawn from a normal
// distribution (flat: top-p keeps thousands) and on peaked ones (a few tokens carry the mass, as a
// model's usually do). Results: docs/BENCHMARKS.md.
//
//   build/bench_sampler --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

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

}  // namespace

BENCHMARK_CAPTURE(run, server_defaults_flat, with(0.7f, 20, 0.95f, 0.0f), false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(run, server_defaults_peaked, with(0.7f, 20, 0.95f, 0.0f), true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(run, top_k_200_peaked, with(0.7f, 200, 1.0f, 0.0f), true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(run, top_p_only_peaked, with(0.7f, 0, 0.95f, 0.0f), true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(run, min_p_only_peaked, with(0.7f, 0, 1.0f, 0.05f), true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(run, greedy, with(0.0f, 0, 1.0f, 0.0f), true)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
