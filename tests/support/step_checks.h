// Shared by the GPU step tests (verify windows, rows of several sequences): bit-for-bit comparison
// of float rows, the greedy rule, deterministic tokens spread over a vocabulary, and who computed
// the expert tier's misses.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef LODE_HAVE_CUDA
#include "cuda/session.h"
#include "plan/miss_split.h"
#endif

namespace lode::test {

inline bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// The lowest index among the largest (decode_greedy's rule).
inline int32_t argmax(const float* v, int64_t n) { return int32_t(std::max_element(v, v + n) - v); }

// n tokens for a test: spread over the vocabulary, deterministic in `seed`.
inline std::vector<int32_t> tokens_from(int64_t vocab, int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((int64_t(i) * 7919 + seed * 104729 + 13) % vocab));
  return t;
}

#ifdef LODE_HAVE_CUDA
// A session's steps whose bits cannot tell who computed an absent expert, told by its tier's
// counts: some routings missed; with `--miss-path cpu` (every miss within a request's caps) no
// decode step read an expert over PCIe and the CPU computed some; with `gpu` the CPU computed none.
inline void expect_misses_computed_by(plan::MissPath path, const cuda::ExpertStats& stats) {
  EXPECT_GT(stats.missed, 0u) << to_string(path);
  if (path == plan::MissPath::cpu) {
    EXPECT_EQ(stats.decode_miss_bytes, 0u) << stats.miss_path;
    EXPECT_GT(stats.cpu_experts, 0u) << stats.miss_path;
  }
  if (path == plan::MissPath::gpu) EXPECT_EQ(stats.cpu_experts, 0u) << stats.miss_path;
}
#endif

}  // namespace lode::test
