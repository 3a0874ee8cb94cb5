#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "core/error.h"
#include "sample/logprobs.h"
#include "sample/sampler.h"

using namespace lode;
using namespace lode::sample;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(n);
  for (float& x : logits) x = normal(gen);
  return logits;
}

// The reference order: indices by logit descending, lowest id first on ties.
std::vector<int32_t> ranked(const std::vector<float>& logits) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  return ids;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < p.size(); ++i) total += p[i] = std::exp((logits[i] - top) / temperature);
  for (double& x : p) x /= total;
  return p;
}

SamplingParams plain(float temperature) {
  SamplingParams params;
  params.temperature = temperature;
  params.top_k = 0;
  params.top_p = 1.0f;
  params.min_p = 0.0f;
  return params;
}

std::vector<int32_t> kept_ids(const std::vector<float>& logits, const SamplingParams& params) {
  std::vector<detail::Candidate> out;
  detail::build_distribution(logits, params, out);
  std::vector<int32_t> ids;
  for (const auto& c : out) ids.push_back(c.id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<float> logits_of(std::initializer_list<double> probabilities) {
  std::vector<float> logits;
  for (double p : probabilities) logits.push_back(float(std::log(p)));
  return logits;
}

}  // namespace

TEST(SamplerRng, SplitmixMatchesThePublishedFirstOutput) {
  uint64_t state = 0;
  EXPECT_EQ(detail::splitmix64(state), 0xe220a8397b1dcdafull);  // Vigna's splitmix64, seed 0
}

TEST(SamplerRng, UniformIsInUnitIntervalWithMeanOneHalf) {
  detail::Rng rng(7);
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
}

// A token's probability under the softmax at temperature 1 (the MTP drafters' --mtp-min-p).
TEST(Sampler, ProbabilityOfATokenIsItsSoftmaxShare) {
  const std::vector<float> logits = {0.0f, std::log(3.0f), -1e30f};
  EXPECT_NEAR(lode::sample::probability_of(logits, 1), 0.75, 1e-6);
  EXPECT_NEAR(lode::sample::probability_of(logits, 0), 0.25, 1e-6);
  EXPECT_NEAR(lode::sample::probability_of(std::vector<float>{2.0f}, 0), 1.0, 1e-12);
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  Sampler sampler(plain(0.0f), 6);
  EXPECT_EQ(sampler.sample(std::vector<float>{1, 5, 2, 5, 5, -1}), 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{-kInf, -3, -3, -kInf, -4, -3}), 1);
  for (uint32_t seed = 0; seed < 20; ++seed) {
    auto logits = random_logits(6, seed);
    logits[seed % 6] = logits[(seed + 3) % 6] = 10.0f;  // a tie at the top
    const auto expected = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(sampler.sample(logits), expected);
  }
}

// sample::greedy is what a plain greedy sampler takes, and plain_greedy says when sample() is
// just that (no bias, no penalty that looks at any token), so an engine may choose the token.
TEST(Sampler, PlainGreedyIsTheArgmaxOfTheLogitsAsTheyCome) {
  const std::vector<float> logits{1, 5, 2, 5, 5, -1};
  EXPECT_EQ(sample::greedy(logits), 1);
  EXPECT_THROW(sample::greedy(std::vector<float>{0, std::nanf(""), 1}), Error);
  EXPECT_THROW(sample::greedy(std::vector<float>(3, -kInf)), Error);
  EXPECT_TRUE(Sampler(plain(0.0f), 6).plain_greedy());
  EXPECT_FALSE(Sampler(plain(0.7f), 6).plain_greedy());
  SamplingParams biased = plain(0.0f);
  biased.logit_bias = {{1, -kInf}};
  EXPECT_FALSE(Sampler(biased, 6).plain_greedy());
  SamplingParams penalised = plain(0.0f);
  penalised.repeat_penalty = 1.1f;
  EXPECT_FALSE(Sampler(penalised, 6).plain_greedy());
  penalised.penalty_last_n = 0;  // the penalty looks at no token
  EXPECT_TRUE(Sampler(penalised, 6).plain_greedy());
  penalised.penalty_last_n = -1;  // every token so far
  EXPECT_FALSE(Sampler(penalised, 6).plain_greedy());
  SamplingParams present = plain(0.0f);
  present.presence_penalty = 0.5f;
  EXPECT_FALSE(Sampler(present, 6).plain_greedy());
  SamplingParams frequent = plain(0.0f);
  frequent.frequency_penalty = 0.5f;
  EXPECT_FALSE(Sampler(frequent, 6).plain_greedy());
  SamplingParams cut = plain(0.0f);  // the filters do not apply to greedy sampling
  cut.top_k = 3, cut.top_p = 0.5f, cut.min_p = 0.2f;
  EXPECT_TRUE(Sampler(cut, 6).plain_greedy());
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDiffers) {
  SamplingParams params = plain(1.0f);
  params.seed = 1234;
  Sampler a(params, 50), b(params, 50);
  params.seed = 1235;
  Sampler c(params, 50);
  std::vector<int32_t> from_a, from_c;
  for (uint32_t step = 0; step < 200; ++step) {
    const auto logits = random_logits(50, step, 0.5f);
    const int32_t token = a.sample(logits);
    EXPECT_EQ(token, b.sample(logits)) << "step " << step;
    from_a.push_back(token);
    from_c.push_back(c.sample(logits));
  }
  EXPECT_NE(from_a, from_c);
  a.reset();
  for (uint32_t step = 0; step < 200; ++step)
    EXPECT_EQ(a.sample(random_logits(50, step, 0.5f)), from_a[step]) << "after reset, " << step;
}

TEST(Sampler, FrequenciesMatchSoftmaxAtTheTemperature) {
  const std::vector<float> logits{1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f, 2.2f, -0.3f};
  const double temperature = 0.7;
  const auto expected = softmax(logits, temperature);
  SamplingParams params = plain(float(temperature));
  params.seed = 99;
  Sampler sampler(params, int64_t(logits.size()));
  const int n = 200000;
  std::vector<int> counts(logits.size());
  for (int i = 0; i < n; ++i) ++counts[size_t(sampler.sample(logits))];
  double chi_square = 0, max_diff = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double want = expected[i] * n;
    chi_square += (counts[i] - want) * (counts[i] - want) / want;
    max_diff = std::max(max_diff, std::abs(counts[i] / double(n) - expected[i]));
  }
  EXPECT_LT(chi_square, 24.32);  // 7 degrees of freedom, p = 0.001
  EXPECT_LT(max_diff, 0.006);    // ~5 standard deviations of the largest frequency
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams params = plain(1.5f);
  params.top_k = 1;
  Sampler sampled(params, 300);
  Sampler greedy(plain(0.0f), 300);
  for (uint32_t step = 0; step < 50; ++step) {
    const auto logits = random_logits(300, step, 0.2f);
    EXPECT_EQ(sampled.sample(logits), greedy.sample(logits)) << "step " << step;
  }
}

TEST(Sampler, TopKKeepsExactlyTheKBest) {
  const auto logits = random_logits(250000, 5);
  const auto order = ranked(logits);
  for (int k : {1, 5, 20, 1000}) {
    SamplingParams params = plain(0.8f);
    params.top_k = k;
    std::vector<int32_t> expected(order.begin(), order.begin() + k);
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(kept_ids(logits, params), expected) << "k " << k;
  }
  // Ties at the boundary: the lower ids win.
  SamplingParams params = plain(1.0f);
  params.top_k = 2;
  EXPECT_EQ(kept_ids({1, 3, 1, 1, 0}, params), (std::vector<int32_t>{0, 1}));
  // Drawing never leaves the k best, and reaches each of them.
  params.top_k = 3;
  Sampler sampler(params, 6);
  std::set<int32_t> seen;
  const std::vector<float> close{0.1f, 0.3f, 0, 0.2f, -5, 0.25f};
  for (int i = 0; i < 2000; ++i) seen.insert(sampler.sample(close));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3, 5}));
}

// The candidates top-k leaves, as the plain definition makes them: every finite logit in token
// order, then, where k cuts, the k best by (logit, lower id), best first; with their probabilities
// at the temperature, summed in that order. (build_distribution finds them in one bounded pass.)
std::vector<detail::Candidate> reference_top_k(const std::vector<float>& logits, size_t k, double temperature) {
  std::vector<detail::Candidate> kept;
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] != -kInf) kept.push_back({int32_t(i), logits[i], 0.0});
  if (k < kept.size()) {
    std::stable_sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.logit > b.logit; });
    kept.resize(k);
  }
  double top = -kInf, total = 0;
  for (const auto& c : kept) top = std::max(top, double(c.logit));
  for (auto& c : kept) total += c.p = std::exp((double(c.logit) - top) / temperature);
  for (auto& c : kept) c.p /= total;
  return kept;
}

// Logits with many ties (a few distinct values), bans (-inf) alone and in whole blocks, -0 beside
// +0, and vocabularies where top-k cuts nothing: the candidates, their order and their
// probabilities must be exactly the plain definition's.
TEST(Sampler, TopKMatchesThePlainDefinitionExactly) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t n = std::vector<size_t>{1, 5, 63, 64, 65, 1000, 4096, 250000}[size_t(trial) % 8];
    std::vector<float> logits = random_logits(n, uint32_t(trial), trial % 3 == 0 ? 0.5f : 3.0f);
    if (trial % 4 == 1)  // few distinct values: ties everywhere
      for (float& x : logits) x = std::round(x);
    if (trial % 4 == 2)  // -0 and +0
      for (size_t i = 0; i < n; i += 2) logits[i] = i % 4 == 0 ? -0.0f : 0.0f;
    if (trial % 5 == 3)  // bans, some in whole blocks, sometimes all but a few
      for (size_t i = 0; i < n; ++i)
        if (gen() % (trial % 2 ? 2 : 50) == 0 || (i / 64) % 3 == 1) logits[i] = -kInf;
    if (std::all_of(logits.begin(), logits.end(), [](float x) { return x == -kInf; })) logits[n / 2] = 1.0f;
    const size_t k = std::vector<size_t>{1, 2, 20, 64, 100, 5000}[size_t(trial) % 6];
    SamplingParams params = plain(0.7f);
    params.top_k = int(k);
    std::vector<detail::Candidate> got;
    detail::build_distribution(logits, params, got);
    const std::vector<detail::Candidate> want = reference_top_k(logits, k, double(params.temperature));
    ASSERT_EQ(got.size(), want.size()) << "trial " << trial;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].id, want[i].id) << "trial " << trial << ", candidate " << i;
      ASSERT_EQ(std::memcmp(&got[i].p, &want[i].p, sizeof(double)), 0) << "trial " << trial << ", candidate " << i;
    }
  }
}

// A sampler that takes top candidates draws, seed for seed, what it draws from the whole row: with
// top-k 1 to 64, top-p and min-p, at several temperatures, on rows with ties, bans and vocabularies
// where top-k cuts nothing; the candidates in any order.
TEST(Sampler, SampleTopGivesWhatTheWholeRowGives) {
  std::mt19937 gen(3);
  for (int trial = 0; trial < 120; ++trial) {
    const size_t n = std::vector<size_t>{3, 40, 64, 65, 3000, 248320}[size_t(trial) % 6];
    std::vector<float> row = random_logits(n, uint32_t(100 + trial), trial % 2 ? 1.0f : 4.0f);
    if (trial % 3 == 1)
      for (float& x : row) x = std::round(x * 2) / 2;  // ties
    if (trial % 4 == 3)
      for (size_t i = 0; i < n; ++i)
        if (gen() % 3 == 0) row[i] = -kInf;
    if (std::all_of(row.begin(), row.end(), [](float x) { return x == -kInf; })) row[0] = 0.5f;
    SamplingParams params = plain(std::vector<float>{0.3f, 0.7f, 1.0f, 1.6f}[size_t(trial) % 4]);
    params.top_k = std::vector<int>{1, 20, 40, 64, 7}[size_t(trial) % 5];
    params.top_p = trial % 3 ? 0.9f : 1.0f;
    params.min_p = trial % 5 == 2 ? 0.05f : 0.0f;
    params.seed = uint64_t(trial);
    Sampler whole(params, int64_t(n)), from_top(params, int64_t(n));
    ASSERT_TRUE(from_top.takes_top());
    TopCandidates top = top_candidates(row, kTopCandidates);
    std::shuffle(top.best.begin(), top.best.end(), gen);  // (a GPU gives them in no order)
    for (int draw = 0; draw < 20; ++draw)
      ASSERT_EQ(whole.sample(row), from_top.sample_top(top)) << "trial " << trial << ", draw " << draw;
  }
}

// top_candidates: the n best by (logit, lower id), every finite logit where there are no more;
// the count of finite logits, -1 for a row with NaN or +inf, which sample_top refuses as sample()
// does; and what it cannot decide.
TEST(Sampler, TopCandidatesAndWhatSampleTopRefuses) {
  const std::vector<float> row = {1, 3, -kInf, 3, 2, -kInf, 0};
  const TopCandidates two = top_candidates(row, 2);
  ASSERT_EQ(two.best.size(), 2u);
  EXPECT_EQ(two.best[0].id, 1);
  EXPECT_EQ(two.best[1].id, 3);
  EXPECT_EQ(two.finite, 5);
  const TopCandidates all = top_candidates(row, 64);
  ASSERT_EQ(all.best.size(), 5u);
  EXPECT_EQ(all.best.back().id, 6);
  EXPECT_EQ(greedy(two), greedy(row));  // the first of the equal best, whatever the order
  EXPECT_EQ(greedy(TopCandidates{.best = {{3, 3.0f}, {1, 3.0f}}, .finite = 5}), 1);
  SamplingParams params = plain(0.8f);
  params.top_k = 3;
  Sampler sampler(params, int64_t(row.size()));
  for (const std::vector<float>& broken : {std::vector<float>{1, std::nanf(""), 2}, std::vector<float>{1, kInf}}) {
    const TopCandidates none = top_candidates(broken, 2);  // (the row's sampler fails, not the step)
    EXPECT_EQ(none.finite, -1);
    EXPECT_TRUE(none.best.empty());
    EXPECT_THROW(sampler.sample_top(none), Error);
    EXPECT_THROW(greedy(none), Error);
  }
  EXPECT_THROW(sampler.sample_top(two), Error);  // 2 candidates for a top-k of 3 among 5
  EXPECT_NO_THROW(sampler.sample_top(all));
  params.top_k = 0;
  EXPECT_FALSE(Sampler(params, 7).takes_top());
  params.top_k = 65;
  EXPECT_FALSE(Sampler(params, 70).takes_top());
  EXPECT_FALSE(Sampler(plain(0.0f), 70).takes_top());
  // Penalties over more distinct tokens than a step sets aside take the whole row.
  params.top_k = 20, params.presence_penalty = 0.5f, params.penalty_last_n = -1;
  Sampler long_memory(params, 1000);
  for (int32_t t = 0; t < kTopAsideMost; ++t) long_memory.accept(t);
  EXPECT_TRUE(long_memory.takes_top());
  long_memory.accept(kTopAsideMost);
  EXPECT_FALSE(long_memory.takes_top());
  // A window longer than that, of few distinct tokens, still takes the top candidates.
  Sampler repetitive(params, 1000);
  for (int32_t t = 0; t < 3 * kTopAsideMost; ++t) repetitive.accept(t % 10);
  EXPECT_TRUE(repetitive.takes_top());
}

// With a logit bias and penalties, the tokens they change are set aside (Sampler::top_aside) and
// the rest's best found apart: sampling from those gives what sampling the whole row gives, draw
// after draw as the history grows, where the penalised tokens crowd the row's best (a history of
// them), where the bias lifts a poor token to the top or bans good ones, and where the bans leave
// no more finite logits than the top-k; greedy sampling (temperature 0) too.
TEST(Sampler, SampleTopWithBiasAndPenaltiesGivesWhatTheWholeRowGives) {
  std::mt19937 gen(5);
  for (int trial = 0; trial < 60; ++trial) {
    const size_t n = std::vector<size_t>{40, 3000, 248320}[size_t(trial) % 3];
    std::vector<float> row = random_logits(n, uint32_t(300 + trial), trial % 2 ? 1.0f : 4.0f);
    if (trial % 4 == 1)
      for (float& x : row) x = std::round(x * 2) / 2;  // ties
    SamplingParams params = plain(trial % 5 == 4 ? 0.0f : std::vector<float>{0.5f, 1.0f, 1.3f}[size_t(trial) % 3]);
    params.top_k = trial % 5 == 4 ? trial % 2 * 20 : std::vector<int>{20, 64, 5, 40}[size_t(trial) % 4];
    params.top_p = trial % 3 ? 0.95f : 1.0f;
    params.seed = uint64_t(trial);
    params.repeat_penalty = trial % 2 ? 1.3f : 1.0f;
    params.presence_penalty = trial % 3 == 0 ? 0.8f : trial % 3 == 1 ? -0.4f : 0.0f;
    params.frequency_penalty = trial % 5 == 0 ? 0.3f : 0.0f;
    params.penalty_last_n = trial % 7 == 0 ? -1 : 64;
    const TopCandidates plain_top = top_candidates(row, kTopCandidates);
    if (trial % 4 == 2) params.logit_bias.emplace_back(int32_t(gen() % n), 25.0f);  // a poor token lifted
    if (params.temperature == 0.0f && trial % 8 == 3) params.repeat_penalty = 1.0f;  // (greedy, no repetition penalty)
    if (trial % 4 == 3)  // good tokens banned (with a small row, all but 30)
      for (size_t i = 0; i < (n == 40 ? 10 : plain_top.best.size() / 2); ++i)
        params.logit_bias.emplace_back(n == 40 ? int32_t(i) : plain_top.best[i].id, -kInf);
    if (params.temperature == 0.0f && params.logit_bias.empty() && params.repeat_penalty == 1.0f &&
        params.presence_penalty == 0.0f && params.frequency_penalty == 0.0f)
      params.presence_penalty = 0.2f;  // (plain greedy takes the greedy token alone, not top candidates)
    Sampler whole(params, int64_t(n)), from_top(params, int64_t(n));
    for (size_t i = 0; i < plain_top.best.size(); i += 2)  // a history of the row's best tokens
      whole.accept(plain_top.best[i].id), from_top.accept(plain_top.best[i].id);
    for (int draw = 0; draw < 20; ++draw) {
      ASSERT_TRUE(from_top.takes_top()) << "trial " << trial;
      const std::vector<int32_t> aside = from_top.top_aside();
      TopCandidates top = top_candidates(row, kTopCandidates, aside);
      std::shuffle(top.best.begin(), top.best.end(), gen);
      const int32_t want = whole.sample(row);
      ASSERT_EQ(want, from_top.sample_top(top)) << "trial " << trial << ", draw " << draw;
      whole.accept(want), from_top.accept(want);
    }
  }
}

// The ids set aside are those the bias and penalties change, ascending; sample_top refuses
// candidates that set aside others, and a bias that takes a logit to +inf.
TEST(Sampler, TopAsideIsWhatTheBiasAndPenaltiesChange) {
  SamplingParams params = plain(0.8f);
  params.top_k = 10, params.logit_bias = {{9, 1.0f}, {2, -kInf}};
  Sampler biased(params, 20);
  EXPECT_EQ(biased.top_aside(), (std::vector<int32_t>{2, 9}));
  biased.accept(5);  // no penalty: the history sets nothing aside
  EXPECT_EQ(biased.top_aside(), (std::vector<int32_t>{2, 9}));
  params.repeat_penalty = 1.1f, params.penalty_last_n = 2;
  Sampler penalised(params, 20);
  for (const int32_t t : {7, 3, 3, 9}) penalised.accept(t);
  EXPECT_EQ(penalised.top_aside(), (std::vector<int32_t>{2, 3, 9}));  // the last two tokens, the bias's
  std::vector<float> row(20, 0.0f);
  row[4] = 1.0f;
  const TopCandidates unaware = top_candidates(row, kTopCandidates);
  EXPECT_THROW(penalised.sample_top(unaware), Error);
  EXPECT_NO_THROW(penalised.sample_top(top_candidates(row, kTopCandidates, penalised.top_aside())));
  params.logit_bias = {{4, 3e38f}}, params.repeat_penalty = 1.0f;
  row[4] = 3e38f;
  Sampler overflow(params, 20);
  EXPECT_THROW(overflow.sample_top(top_candidates(row, kTopCandidates, overflow.top_aside())), Error);
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  const auto logits = logits_of({0.05, 0.5, 0.1, 0.2, 0.15});  // best first: 1, 3, 4, 2, 0
  SamplingParams params = plain(1.0f);
  params.top_p = 0.45f;
  EXPECT_EQ(kept_ids(logits, params), (std::vector<int32_t>{1}));
  params.top_p = 0.69f;
  EXPECT_EQ(kept_ids(logits, params), (std::vector<int32_t>{1, 3}));
  params.top_p = 0.71f;
  EXPECT_EQ(kept_ids(logits, params), (std::vector<int32_t>{1, 3, 4}));
  params.top_p = 0.0f;
  EXPECT_EQ(kept_ids(logits, params), (std::vector<int32_t>{1}));
  params.top_p = 0.99f;
  EXPECT_EQ(kept_ids(logits, params), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  // After top-k, the mass is that of the k survivors: 0.5 / 0.7 > 0.69.
  params.top_k = 2;
  params.top_p = 0.69f;
  EXPECT_EQ(kept_ids(logits, params), (std::vector<int32_t>{1}));
}

TEST(Sampler, TopPOnALargeVocabularyMatchesAFullSort) {
  for (float scale : {0.3f, 2.0f, 8.0f}) {
    const auto logits = random_logits(250000, 11, scale);
    const auto p = softmax(logits, 1.0);
    const auto order = ranked(logits);
    for (float top_p : {0.1f, 0.5f, 0.9f, 0.95f}) {
      double mass = 0;
      size_t keep = 0;
      while (mass < top_p) mass += p[size_t(order[keep++])];
      std::vector<int32_t> expected(order.begin(), order.begin() + ptrdiff_t(keep));
      std::sort(expected.begin(), expected.end());
      SamplingParams params = plain(1.0f);
      params.top_p = top_p;
      EXPECT_EQ(kept_ids(logits, params), expected) << "scale " << scale << " top_p " << top_p;
    }
  }
  // A flat distribution: exactly half the tokens, the lowest ids.
  SamplingParams params = plain(1.0f);
  params.top_p = 0.5f;
  const auto kept = kept_ids(std::vector<float>(100000, 0.25f), params);
  ASSERT_EQ(kept.size(), 50000u);
  EXPECT_EQ(kept.back(), 49999);
}

// Top-p without top-k, on 250k logits with many ties, -0 beside +0 and banned tokens: the kept
// candidates, their order and their probabilities are those of the plain definition (every finite
// logit weighed in token order, a full sort by logit then id, the shortest prefix reaching p, the
// temperature's weights over it), bit for bit, however the sampler sorts.
TEST(Sampler, TopPWithoutTopKMatchesThePlainDefinitionExactly) {
  using detail::Candidate;
  std::mt19937 rng(17);
  for (const float scale : {0.3f, 2.0f, 6.0f}) {
    std::vector<float> logits = random_logits(250000, 23, scale);
    for (size_t i = 0; i < logits.size(); ++i) {
      logits[i] = std::round(logits[i] * 8.0f) / 8.0f;  // a few thousand values: long runs of ties
      if (logits[i] == 0.0f) logits[i] = rng() % 2 ? 0.0f : -0.0f;
      if (rng() % 50 == 0) logits[i] = -std::numeric_limits<float>::infinity();
    }
    for (const float top_p : {0.5f, 0.9f, 0.95f, 0.999f})
      for (const float temperature : {0.7f, 1.0f}) {
        SCOPED_TRACE(testing::Message() << "scale " << scale << " top_p " << top_p << " temperature " << temperature);
        std::vector<Candidate> want;
        for (size_t i = 0; i < logits.size(); ++i)
          if (logits[i] != -std::numeric_limits<float>::infinity()) want.push_back({int32_t(i), logits[i], 0.0});
        float best = want[0].logit;
        for (const Candidate& c : want) best = std::max(best, c.logit);
        double total = 0.0;
        for (Candidate& c : want) total += c.p = std::exp(double(c.logit) - best);
        std::sort(want.begin(), want.end(), [](const Candidate& a, const Candidate& b) {
          return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
        });
        double mass = 0.0;
        for (size_t i = 0; i < want.size(); ++i)
          if ((mass += want[i].p) >= double(top_p) * total) {
            want.resize(i + 1);
            break;
          }
        double kept = 0.0;
        for (Candidate& c : want) kept += c.p = std::exp((double(c.logit) - best) / double(temperature));
        for (Candidate& c : want) c.p /= kept;

        SamplingParams params = plain(temperature);
        params.top_p = top_p;
        std::vector<Candidate> got;
        detail::build_distribution(logits, params, got);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(got[i].id, want[i].id) << "place " << i;
          ASSERT_EQ(std::bit_cast<uint32_t>(got[i].logit), std::bit_cast<uint32_t>(want[i].logit)) << "place " << i;
          ASSERT_EQ(std::bit_cast<uint64_t>(got[i].p), std::bit_cast<uint64_t>(want[i].p)) << "place " << i;
        }
      }
  }
}

TEST(Sampler, MinPKeepsTokensAboveAFractionOfTheBest) {
  const auto logits = logits_of({0.05, 0.4, 0.2, 0.3, 0.05});
  SamplingParams params = plain(1.0f);
  params.min_p = 0.4f;  // p >= 0.16
  EXPECT_EQ(kept_ids(logits, params), (std::vector<int32_t>{1, 2, 3}));
  params.min_p = 0.6f;  // p >= 0.24
  EXPECT_EQ(kept_ids(logits, params), (std::vector<int32_t>{1, 3}));
  params.min_p = 1.0f;
  EXPECT_EQ(kept_ids(logits, params), (std::vector<int32_t>{1}));
  // Survivors are renormalised at the temperature.
  params.min_p = 0.6f;
  params.temperature = 2.0f;
  std::vector<detail::Candidate> out;
  detail::build_distribution(logits, params, out);
  ASSERT_EQ(out.size(), 2u);
  const double a = std::sqrt(0.4), b = std::sqrt(0.3);  // p^(1/T)
  for (const auto& c : out) EXPECT_NEAR(c.p, (c.id == 1 ? a : b) / (a + b), 1e-6);
}

TEST(SamplerPenalties, MatchHandComputedLogits) {
  const std::vector<float> base{2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
  const std::vector<int32_t> recent{0, 1, 0, 3, 0};  // counts: 0 x3, 1 x1, 3 x1
  auto apply = [&](float repeat, float presence, float frequency) {
    SamplingParams params;
    params.repeat_penalty = repeat;
    params.presence_penalty = presence;
    params.frequency_penalty = frequency;
    auto logits = base;
    detail::apply_penalties(logits, recent, params);
    return logits;
  };
  auto expect = [](const std::vector<float>& got, const std::vector<float>& want) {
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "token " << i;
  };
  expect(apply(2.0f, 0, 0), {1.0f, -2.0f, 0.5f, 1.5f, -2.0f});
  expect(apply(1.0f, 0.5f, 0), {1.5f, -1.5f, 0.5f, 2.5f, -2.0f});
  expect(apply(1.0f, 0, 0.25f), {1.25f, -1.25f, 0.5f, 2.75f, -2.0f});
  // All three: repeat first, then 3 * 0.1 + 0.25 off token 0.
  expect(apply(1.5f, 0.25f, 0.1f), {0.7833333f, -1.85f, 0.5f, 1.65f, -2.0f});
}

TEST(SamplerPenalties, LookOnlyAtTheLastNAcceptedTokens) {
  const std::vector<float> logits{3.0f, 2.9f, 0.0f, 0.0f};
  SamplingParams params = plain(0.0f);
  params.frequency_penalty = 0.5f;
  params.penalty_last_n = 3;
  Sampler sampler(params, 4);
  EXPECT_EQ(sampler.sample(logits), 0);
  sampler.accept(0);
  EXPECT_EQ(sampler.sample(logits), 1);  // 3.0 - 0.5 < 2.9
  sampler.accept(1);
  sampler.accept(0);                     // token 0 twice: 2.0; token 1 once: 2.4
  EXPECT_EQ(sampler.sample(logits), 1);
  for (int i = 0; i < 3; ++i) sampler.accept(2);  // both fall out of the window
  EXPECT_EQ(sampler.sample(logits), 0);
  for (int i = 0; i < 500; ++i) sampler.accept(i % 2 ? 3 : 0);  // trimming keeps the window right
  sampler.accept(3);
  sampler.accept(3);
  sampler.accept(3);
  EXPECT_EQ(sampler.sample(logits), 0);
  sampler.reset();
  sampler.accept(0);
  EXPECT_EQ(sampler.sample(logits), 1);

  params.penalty_last_n = 0;  // off
  Sampler off(params, 4);
  off.accept(0);
  EXPECT_EQ(off.sample(logits), 0);
}

TEST(Sampler, LogitBiasBansTheArgmax) {
  SamplingParams params = plain(0.0f);
  params.logit_bias = {{2, -kInf}, {0, 0.5f}};
  const std::vector<float> logits{1.0f, 1.2f, 5.0f, 0.0f};
  Sampler greedy(params, 4);
  EXPECT_EQ(greedy.sample(logits), 0);  // 2 banned; 1.0 + 0.5 beats 1.2
  params.temperature = 1.0f;
  params.top_k = 2;
  Sampler sampler(params, 4);
  for (int i = 0; i < 1000; ++i) EXPECT_NE(sampler.sample(logits), 2);
  params.logit_bias = {{0, -kInf}, {1, -kInf}, {2, -kInf}, {3, -kInf}};
  Sampler all_banned(params, 4);
  EXPECT_THROW(all_banned.sample(logits), Error);
}

TEST(Sampler, ValidateNamesTheBadField) {
  auto message = [](SamplingParams params, int64_t n_vocab) -> std::string {
    try {
      validate(params, n_vocab);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  SamplingParams params;
  EXPECT_EQ(message(params, 1000), "");
  params.top_p = 1.5f;
  EXPECT_NE(message(params, 1000).find("top_p 1.5 is outside [0, 1]"), std::string::npos);
  params = {};
  params.min_p = -0.1f;
  EXPECT_NE(message(params, 1000).find("min_p"), std::string::npos);
  params = {};
  params.logit_bias = {{999999, -1.0f}};
  EXPECT_NE(message(params, 1000).find("logit_bias token 999999 is outside the vocabulary of 1000"),
            std::string::npos);
  params = {};
  params.logit_bias = {{3, std::nanf("")}};
  EXPECT_NE(message(params, 1000).find("logit_bias"), std::string::npos);
  params = {};
  params.temperature = std::nanf("");
  EXPECT_NE(message(params, 1000).find("temperature"), std::string::npos);
  params = {};
  params.repeat_penalty = 0.0f;
  EXPECT_NE(message(params, 1000).find("repeat_penalty"), std::string::npos);
  params = {};
  params.frequency_penalty = kInf;
  EXPECT_NE(message(params, 1000).find("frequency_penalty"), std::string::npos);
  params = {};
  params.penalty_last_n = -2;
  EXPECT_NE(message(params, 1000).find("penalty_last_n"), std::string::npos);
  EXPECT_THROW(Sampler(params, 1000), Error);
}

TEST(Sampler, RejectsNaNWrongSizesAndForeignTokens) {
  Sampler sampler(SamplingParams{}, 4);
  EXPECT_THROW(sampler.sample(std::vector<float>{0, std::nanf(""), 1, 2}), Error);
  EXPECT_THROW(sampler.sample(std::vector<float>{0, kInf, 1, 2}), Error);
  EXPECT_THROW(sampler.sample(std::vector<float>{0, 1, 2}), Error);
  EXPECT_THROW(sampler.sample(std::vector<float>(4, -kInf)), Error);
  EXPECT_THROW(sampler.accept(4), Error);
  EXPECT_THROW(sampler.accept(-1), Error);
  try {
    sampler.sample(std::vector<float>{0, 0, std::nanf(""), 0});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 2"), std::string::npos) << e.what();
  }
}
