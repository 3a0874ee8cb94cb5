// Shared by the GPU step tests (verify windows, rows of several sequences): bit-for-bit comparison
// of float rows, the greedy rule, and deterministic tokens spread over a vocabulary.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

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

}  // namespace lode::test
