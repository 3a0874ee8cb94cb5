// Token sampling: turns one position's logits into the next token.
//
//   sample::Sampler sampler({.temperature = 0.7f, .seed = 42}, vocab);
//   for (int32_t t : prompt) sampler.accept(t);          // penalties see the prompt too
//   int32_t next = sampler.sample(logits);               // logits: [vocab]
//   sampler.accept(next);
//
// Order of operations: logit bias, penalties, then greedy (temperature <= 0) or top-k, top-p,
// min-p, temperature, softmax, draw. Top-p and min-p judge probabilities before the temperature
// (as llama.cpp's default chain does), so the temperature only reshapes what survives.
// Deterministic: the same seed and the same logits give the same tokens on every platform; the
// random numbers come from our own xoshiro256** and every ordering is a total order on
// (logit, id), so no result depends on the standard library's algorithms or distributions.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace lode::sample {

struct SamplingParams {
  float temperature = 0.6f;       // <= 0: greedy (argmax, lowest id wins ties)
  int top_k = 20;                 // <= 0: off
  float top_p = 0.95f;            // >= 1: off
  float min_p = 0.0f;             // <= 0: off (keep tokens with p >= min_p * p_max)
  float repeat_penalty = 1.0f;    // 1: off. CTRL/llama.cpp: logit > 0 ? logit / pen : logit * pen
  float presence_penalty = 0.0f;  // OpenAI: minus presence_penalty if the token occurred
  float frequency_penalty = 0.0f; // OpenAI: minus frequency_penalty * count
  int penalty_last_n = 64;        // recent tokens the penalties look at (-1: all, 0: none)
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to logits first (-inf bans)
  uint64_t seed = 0;
};

// Fails (lode::Error) with a message naming the bad field and its allowed range.
void validate(const SamplingParams& params, int64_t n_vocab);

// A token and its logit.
struct Scored {
  int32_t id = 0;
  float logit = 0;
};

// What a step may give a sampler instead of a row of logits: its best logits (by logit, the lower
// id first on ties; every finite one where there are no more than asked for) and how many of the
// row's logits are finite. Samplers whose top-k is at most kTopCandidates sample from the
// kTopCandidates best as from the whole row (Sampler::sample_top): a GPU then copies 64 pairs to
// the host, not 248,320 floats. Tokens whose logits a logit bias or a penalty changes are set
// aside (Sampler::top_aside): their logits come back as they are, and take no part in `best` or
// `finite`, so the best that remain are still the best of the rest after the changes.
struct TopCandidates {
  std::vector<Scored> best{};   // any order
  int64_t finite = 0;           // -1: the row holds a NaN or +inf (and `best` nothing): sample_top fails
  std::vector<Scored> aside{};  // the ids set aside, in the order asked for, with their logits
};
constexpr int kTopCandidates = 64;
// The most ids a row may set aside (a longer penalty window's distinct tokens take the whole row).
constexpr int kTopAsideMost = 256;
// The n best of a row of logits, best first, those of the ids `aside` (distinct) left out and
// returned apart.
TopCandidates top_candidates(std::span<const float> logits, int n, std::span<const int32_t> aside = {});

namespace detail {

// splitmix64 step: advances `state` and returns the next output (used to seed xoshiro).
uint64_t splitmix64(uint64_t& state);

// xoshiro256** (Blackman & Vigna), seeded from one 64-bit seed through splitmix64.
class Rng {
public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  // Uniform in [0, 1): the top 53 bits of next() scaled by 2^-53.
  double uniform();

private:
  uint64_t s_[4];
};

struct Candidate {
  int32_t id;
  float logit;  // after bias and penalties, before the temperature
  double p;     // probability after every filter and the temperature (the candidates sum to 1)
};

// Adds each bias to its token's logit (-inf bans the token).
void apply_logit_bias(std::span<float> logits,
                      std::span<const std::pair<int32_t, float>> logit_bias);
// Applies the repeat, presence and frequency penalties for the tokens of `recent` (the window the
// caller chose; a token's count is how often it occurs there).
void apply_penalties(std::span<float> logits, std::span<const int32_t> recent,
                     const SamplingParams& params);
// Index of the largest logit, the lowest on ties. Fails when every logit is -inf.
int32_t argmax(std::span<const float> logits);
// The candidates left after top-k, top-p and min-p, with their probabilities at the temperature
// (which must be > 0), into `out`. Order: best first when top-k or top-p cut, else token order.
// Fails when every logit is -inf.
void build_distribution(std::span<const float> logits, const SamplingParams& params,
                        std::vector<Candidate>& out);
// build_distribution's top-p, min-p and temperature on candidates top-k left (best first when it
// cut, else every finite logit in token order).
void finish_distribution(std::vector<Candidate>& candidates, const SamplingParams& params,
                         bool best_first);

}  // namespace detail

// The token plain greedy sampling takes from logits [n_vocab]: the lowest id among the largest.
// Fails as Sampler::sample does (a NaN or +inf logit, every logit -inf).
int32_t greedy(std::span<const float> logits);
// The same token from a row's top candidates (the best of them); fails where greedy(logits) would.
int32_t greedy(const TopCandidates& top);

class Sampler {
public:
  Sampler(SamplingParams params, int64_t n_vocab);

  // The next token for these logits [n_vocab]. Does not record it: call accept() for that.
  // Fails on a wrong size, a NaN or +inf logit, or when every token is banned (-inf).
  int32_t sample(std::span<const float> logits);
  // Whether sample_top gives what sample() gives for the whole row: temperature > 0 and a top-k of
  // 1 to kTopCandidates, or greedy sampling with a logit bias or a penalty (plain greedy sampling
  // takes the greedy token alone); and no more than kTopAsideMost tokens set aside.
  bool takes_top() const;
  // The tokens whose logits the logit bias and the penalties change now (ascending, distinct): the
  // ids a step's top candidates set aside.
  std::vector<int32_t> top_aside() const;
  // The token sample() gives for the row `top` holds the top_candidates(row, kTopCandidates,
  // top_aside()) of (from any backend, in any order). Fails where sample() would (a NaN or +inf),
  // unless takes_top(), or when `top` does not hold enough candidates for the top-k or not the
  // ids set aside.
  int32_t sample_top(const TopCandidates& top);
  // Records a token (of the prompt or generated) for the penalties.
  void accept(int32_t token);
  // Forgets the history and restarts the random numbers from the seed.
  void reset();

  const SamplingParams& params() const { return params_; }
  // Whether sample() is the greedy token of the logits as they come (temperature <= 0, no logit
  // bias, no penalty): a caller may then take that token from the engine (engine::decode_greedy).
  bool plain_greedy() const;

private:
  std::span<const int32_t> penalty_window() const;
  // takes_top() with `aside` ids set aside (none where there is no bias and no penalty).
  bool takes_top_with(size_t aside) const;

  SamplingParams params_;
  int64_t n_vocab_;
  detail::Rng rng_;
  std::vector<int32_t> history_;  // trimmed lazily to the last penalty_last_n tokens
  // Scratch reused between calls so a 250k vocabulary does not allocate per token.
  std::vector<float> work_;
  std::vector<detail::Candidate> candidates_;
};

}  // namespace lode::sample
