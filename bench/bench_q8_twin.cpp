// The CPU miss path's products on one thread (cpu/q8_twin.h: the GPU's 8-bit-activation bits on the
// host): an expert of the 35B-A3B ud-q4_k_xl-like synth, its gate or up (512 rows of 2,048 values,
// Q4_K) and its down (2,048 rows of 512, Q5_K), the lm head's Q6_K rows and Q8_0 rows, each one
// matrix again and again (in L2) and the expert's in a round over 96 matrices (beyond L2; whether
// beyond L3 depends on the host). Bytes are the weights read per call. Results: docs/BENCHMARKS.md.
//
//   build/bench_q8_twin --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "core/quant/types.h"
#include "cpu/q8_twin.h"

namespace {

using lode::GgmlType;

// Random bytes with every block's fp16 scales small and finite (speed does not depend on values).
std::vector<uint8_t> random_matrix(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const auto& t = lode::traits(type);
  const size_t bytes = lode::row_bytes(type, cols) * size_t(rows);
  std::vector<uint8_t> w(bytes);
  for (uint8_t& b : w) b = uint8_t(rng());
  const uint16_t small = lode::fp32_to_fp16(0.01f);
  for (size_t b = 0; b + t.block_bytes <= bytes; b += t.block_bytes) {
    const size_t at = type == GgmlType::Q6_K ? b + t.block_bytes - 2 : b;
    std::memcpy(&w[at], &small, 2);
    if (type == GgmlType::Q4_K || type == GgmlType::Q5_K) std::memcpy(&w[at + 2], &small, 2);
  }
  return w;
}

void rows(benchmark::State& state, GgmlType type, int64_t n_rows, int64_t cols, int matrices) {
  std::mt19937 rng(7);
  std::vector<std::vector<uint8_t>> w;
  for (int m = 0; m < matrices; ++m) w.push_back(random_matrix(type, n_rows, cols, rng));
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(n_rows));
  for (float& v : x) v = normal(rng);
  lode::cpu::q8twin::RoundedBuffer rounded(cols);
  lode::cpu::q8twin::round(type, x.data(), nullptr, cols, rounded.x());
  const size_t row_bytes = lode::row_bytes(type, cols);
  int m = 0;
  for (auto _ : state) {
    lode::cpu::q8twin::rows(type, w[size_t(m)].data(), row_bytes, n_rows, cols, rounded.x(), y.data());
    benchmark::DoNotOptimize(y.data());
    m = (m + 1) % matrices;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(row_bytes) * n_rows);
  state.SetLabel(lode::cpu::q8twin::kernel_name(type));
}

constexpr int kRound = 96;  // matrices a round: 57 MB of gates, 69 MB of downs

BENCHMARK_CAPTURE(rows, expert_gate_q4_k_in_l2, GgmlType::Q4_K, 512, 2048, 1);
BENCHMARK_CAPTURE(rows, expert_gate_q4_k_round_of_96, GgmlType::Q4_K, 512, 2048, kRound);
BENCHMARK_CAPTURE(rows, expert_down_q5_k_in_l2, GgmlType::Q5_K, 2048, 512, 1);
BENCHMARK_CAPTURE(rows, expert_down_q5_k_round_of_96, GgmlType::Q5_K, 2048, 512, kRound);
BENCHMARK_CAPTURE(rows, q6_k_2048_in_l2, GgmlType::Q6_K, 512, 2048, 1);
BENCHMARK_CAPTURE(rows, q8_0_2048_in_l2, GgmlType::Q8_0, 512, 2048, 1);

}  // namespace

BENCHMARK_MAIN();
