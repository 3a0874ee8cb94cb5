// A small deterministic random source (splitmix64) and the float distributions the generators draw
// from. Only integer arithmetic and exact float operations: the same seed gives the same bits on
// every machine, whatever its libm.
#pragma once
#include <stdint.h>

struct rng { uint64_t state; };

static inline uint64_t rng_next(struct rng *r) {
  uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// An integer in [lo, hi].
static inline int rng_int(struct rng *r, int lo, int hi) {
  return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

// Uniform in [0, 1), 24 random bits (exact in float).
static inline float rng_unit(struct rng *r) { return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f); }

static inline float rng_uniform(struct rng *r, float lo, float hi) { return lo + (hi - lo) * rng_unit(r); }

// Approximately standard normal: the sum of 12 uniforms minus 6 (tails end at +-6).
static inline float rng_gauss(struct rng *r) {
  float sum = 0.0f;
  for (int i = 0; i < 12; ++i) sum += rng_unit(r);
  return sum - 6.0f;
}
