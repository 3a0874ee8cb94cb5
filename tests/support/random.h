// Random test data shared by the test files.
#pragma once
#include <random>
#include <vector>

namespace lode::test {

// n values offset + scale * N(0, 1).
inline std::vector<float> normal_floats(size_t n, std::mt19937& rng, float scale = 1.0f, float offset = 0.0f) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = offset + scale * normal(rng);
  return v;
}

}  // namespace lode::test
