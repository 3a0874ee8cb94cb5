#include "sample/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"

namespace lode::sample {

namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

void check_unit_interval(const char* name, float value) {
  if (!(value >= 0.0f && value <= 1.0f))
    fail("{} {} is outside [0, 1]; use a value in that range ({} = 1 or 0 turns it off)", name,
         value, name);
}

}  // namespace

void validate(const SamplingParams& params, int64_t n_vocab) {
  if (n_vocab <= 0 || n_vocab > std::numeric_limits<int32_t>::max())
    fail("vocabulary size {} is invalid; the model must have between 1 and 2^31-1 tokens", n_vocab);
  if (!std::isfinite(params.temperature))
    fail("temperature {} is not a finite number; use 0 for greedy or a positive value",
         params.temperature);
  check_unit_interval("top_p", params.top_p);
  check_unit_interval("min_p", params.min_p);
  if (!(params.repeat_penalty > 0.0f) || !std::isfinite(params.repeat_penalty))
    fail("repeat_penalty {} must be a finite number > 0 (1 turns it off)", params.repeat_penalty);
  if (!std::isfinite(params.presence_penalty))
    fail("presence_penalty {} is not a finite number (0 turns it off)", params.presence_penalty);
  if (!std::isfinite(params.frequency_penalty))
    fail("frequency_penalty {} is not a finite number (0 turns it off)", params.frequency_penalty);
  if (params.penalty_last_n < -1)
    fail("penalty_last_n {} is invalid; use -1 (whole history), 0 (off) or a window length",
         params.penalty_last_n);
  for (const auto& [token, bias] : params.logit_bias) {
    if (token < 0 || token >= n_vocab)
      fail("logit_bias token {} is outside the vocabulary of {}; use ids in [0, {})", token,
           n_vocab, n_vocab);
    if (std::isnan(bias) || bias == std::numeric_limits<float>::infinity())
      fail("logit_bias of token {} is {}; use a finite bias, or -inf to ban the token", token,
           bias);
  }
}

namespace detail {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Rng::Rng(uint64_t seed) {
  // splitmix64 never yields four zeros in a row, the one state xoshiro must not start from.
  for (uint64_t& word : s_) word = splitmix64(seed);
}

uint64_t Rng::next() {
  const uint64_t result = std::rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = std::rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

void apply_logit_bias(std::span<float> logits,
                      std::span<const std::pair<int32_t, float>> logit_bias) {
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0 || size_t(token) >= logits.size())
      fail("logit_bias token {} is outside the vocabulary of {}", token, logits.size());
    logits[size_t(token)] += bias;
  }
}

void apply_penalties(std::span<float> logits, std::span<const int32_t> recent,
                     const SamplingParams& params) {
  const bool active = params.repeat_penalty != 1.0f || params.presence_penalty != 0.0f ||
                      params.frequency_penalty != 0.0f;
  if (!active || recent.empty()) return;
  // Sorting a copy groups equal tokens into runs: count = run length. The window is small (64 by
  // default), so this beats hashing and needs no per-vocabulary state.
  std::vector<int32_t> tokens(recent.begin(), recent.end());
  std::sort(tokens.begin(), tokens.end());
  for (size_t begin = 0; begin < tokens.size();) {
    size_t end = begin;
    while (end < tokens.size() && tokens[end] == tokens[begin]) ++end;
    const int32_t token = tokens[begin];
    if (token < 0 || size_t(token) >= logits.size())
      fail("history token {} is outside the vocabulary of {}", token, logits.size());
    float& logit = logits[size_t(token)];
    if (params.repeat_penalty != 1.0f)
      logit = logit > 0.0f ? logit / params.repeat_penalty : logit * params.repeat_penalty;
    logit -= float(end - begin) * params.frequency_penalty + params.presence_penalty;
    begin = end;
  }
}

namespace {

// The largest of logits [begin, end) (-inf for none): the compiler makes this one vector max a
// step (the form of x86's maxps: no NaN reaches here).
float block_max(std::span<const float> logits, size_t begin, size_t end) {
  float top = kMinusInf;
  for (size_t i = begin; i < end; ++i) top = logits[i] > top ? logits[i] : top;
  return top;
}

}  // namespace

// Blocks of 256 logits: a block's maximum in vector steps, the first block holding the largest,
// then its first position holding it.
int32_t argmax(std::span<const float> logits) {
  constexpr size_t kBlock = 256;
  float top = kMinusInf;
  size_t at = 0;
  for (size_t begin = 0; begin < logits.size(); begin += kBlock) {
    const float m = block_max(logits, begin, std::min(logits.size(), begin + kBlock));
    if (m > top) top = m, at = begin;
  }
  if (top == kMinusInf)
    fail("every logit is -inf, so no token can be chosen; check logit_bias does not ban them all");
  while (logits[at] != top) ++at;  // (-0 equals +0: the first of either, as a scan with > takes)
  return int32_t(at);
}

namespace {

// The one order used everywhere: higher logit first, lower id first on ties. A total order, so
// partial selection and sorting give the same result with any standard library.
bool better(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

float max_logit(const std::vector<Candidate>& candidates) {
  float best = kMinusInf;
  for (const Candidate& c : candidates) best = std::max(best, c.logit);
  return best;
}

// Stores exp((logit - max) / temperature) in p; returns their sum.
double set_weights(std::vector<Candidate>& candidates, double temperature) {
  const double top = max_logit(candidates);
  double total = 0.0;
  for (Candidate& c : candidates) {
    c.p = std::exp((double(c.logit) - top) / temperature);
    total += c.p;
  }
  return total;
}

// Every finite logit, in token order, into `out`.
void every_finite(std::span<const float> logits, std::vector<Candidate>& out) {
  out.clear();
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] != kMinusInf) out.push_back({int32_t(i), logits[i], 0.0});
}

// The k best finite logits, best first, into `out`, in one pass that holds only k candidates (a
// heap with the worst on top): the k best of nth_element over every candidate, without building
// 250k of them. Blocks whose largest logit cannot enter are skipped whole after counting their
// finite logits (loops the compiler vectorizes). False when there are no more than k finite
// logits (top-k then cuts nothing, and `out` is left unspecified). `finite`: how many there are.
bool keep_best_k(std::span<const float> logits, size_t k, std::vector<Candidate>& out, size_t& finite) {
  constexpr size_t kBlock = 64;
  out.clear();
  finite = 0;
  float worst = kMinusInf;  // the heap's worst logit, once it holds k
  for (size_t begin = 0; begin < logits.size(); begin += kBlock) {
    const size_t end = std::min(logits.size(), begin + kBlock);
    const float top = block_max(logits, begin, end);
    int banned = 0;
    for (size_t i = begin; i < end; ++i) banned += logits[i] == kMinusInf;
    finite += end - begin - size_t(banned);
    if (out.size() == k && top <= worst) continue;
    for (size_t i = begin; i < end; ++i) {
      const float x = logits[i];
      if (x == kMinusInf) continue;
      if (out.size() < k) {
        out.push_back({int32_t(i), x, 0.0});
        std::push_heap(out.begin(), out.end(), better);
        worst = out.front().logit;
        continue;
      }
      // Ids only grow, so a logit equal to the worst comes after it in the order: not better.
      if (x <= worst) continue;
      std::pop_heap(out.begin(), out.end(), better);
      out.back() = {int32_t(i), x, 0.0};
      std::push_heap(out.begin(), out.end(), better);
      worst = out.front().logit;
    }
  }
  if (finite <= k) return false;
  std::sort(out.begin(), out.end(), better);
  return true;
}

// A candidate's logit as an integer that orders as `better` does, best first (-0 as +0, as the
// float comparison has them equal).
uint32_t best_first_key(float logit) {
  const uint32_t bits = std::bit_cast<uint32_t>(logit == 0.0f ? 0.0f : logit);
  return bits & 0x80000000u ? bits : ~(bits | 0x80000000u);
}

// std::sort by `better` where candidates of equal logits come in id order (the order `better`
// gives them): a stable radix sort of the logits' keys where there are many (a top-p without
// top-k sorts 100k candidates), else the comparison sort.
void sort_best_first(std::vector<Candidate>::iterator begin, std::vector<Candidate>::iterator end) {
  const size_t n = size_t(end - begin);
  if (n < 4096) return std::sort(begin, end, better);
  struct Keyed {
    uint32_t key;
    uint32_t at;  // its place in [begin, end)
  };
  std::vector<Keyed> keyed(n), spare(n);
  for (size_t i = 0; i < n; ++i) keyed[i] = {best_first_key(begin[ptrdiff_t(i)].logit), uint32_t(i)};
  constexpr int kBits = 11, kDigits = 1 << kBits;
  std::vector<size_t> count(kDigits + 1);
  for (int shift = 0; shift < 32; shift += kBits) {  // least significant digit first, each pass stable
    std::fill(count.begin(), count.end(), 0);
    for (const Keyed& k : keyed) ++count[((k.key >> shift) & (kDigits - 1)) + 1];
    if (std::find(count.begin() + 1, count.end(), n) != count.end()) continue;  // one digit value: nothing moves
    for (int d = 0; d < kDigits; ++d) count[size_t(d) + 1] += count[size_t(d)];
    for (const Keyed& k : keyed) spare[count[(k.key >> shift) & (kDigits - 1)]++] = k;
    keyed.swap(spare);
  }
  std::vector<Candidate> sorted(n);
  for (size_t i = 0; i < n; ++i) sorted[i] = begin[ptrdiff_t(keyed[i].at)];
  std::copy(sorted.begin(), sorted.end(), begin);
}

// Length of the shortest prefix of [begin, end) whose weights add up to `target`; 0 if none does.
size_t prefix_reaching(std::vector<Candidate>::const_iterator begin,
                       std::vector<Candidate>::const_iterator end, double target) {
  double mass = 0.0;
  for (auto it = begin; it != end; ++it) {
    mass += it->p;
    if (mass >= target) return size_t(it - begin) + 1;
  }
  return 0;
}

// Keeps the smallest best-first prefix whose probability reaches top_p. Unsorted input (in id
// order) is not sorted whole: candidates with weight >= tau * total form a best-first prefix of
// the full order, and tokens below the floor hold at most n * tau of the mass, so once the floor is
// low enough the kept prefix lies inside the sorted part. The floor starts high (a peaked
// distribution sorts a few hundred tokens) and drops 64x per round (a flat 250k vocabulary takes
// ~3 rounds). The partition is stable: equal logits, which have equal weights and so fall on the
// same side, stay in id order for sort_best_first.
void keep_top_p(std::vector<Candidate>& candidates, double top_p, bool best_first) {
  const double total = set_weights(candidates, 1.0);
  const double target = top_p * total;
  if (best_first) {
    if (size_t keep = prefix_reaching(candidates.begin(), candidates.end(), target))
      candidates.resize(keep);
    return;
  }
  // Rounds whose part is too light to hold the prefix are passed over by their weight alone, without
  // sorting (any part that holds the prefix gives the same prefix; one added in another order
  // than the sort's may round either way, and a round too early only sorts again).
  double tau = (1.0 - top_p) / 64.0;
  for (;; tau /= 64.0) {
    double mass = 0.0;
    for (const Candidate& c : candidates) mass += c.p >= tau * total ? c.p : 0.0;
    if (mass >= target) break;
  }
  for (;; tau /= 64.0) {
    const double floor = tau * total;
    auto sorted_end = std::stable_partition(candidates.begin(), candidates.end(),
                                            [floor](const Candidate& c) { return c.p >= floor; });
    sort_best_first(candidates.begin(), sorted_end);
    if (size_t keep = prefix_reaching(candidates.begin(), sorted_end, target)) {
      candidates.resize(keep);
      return;
    }
    if (sorted_end == candidates.end()) return;  // rounding kept the sum short of target: keep all
  }
}

// Keeps tokens with p >= min_p * p_max, i.e. exp(logit - max_logit) >= min_p.
void keep_min_p(std::vector<Candidate>& candidates, double min_p) {
  set_weights(candidates, 1.0);
  std::erase_if(candidates, [min_p](const Candidate& c) { return c.p < min_p; });
}

}  // namespace

void build_distribution(std::span<const float> logits, const SamplingParams& params,
                        std::vector<Candidate>& out) {
  if (!(params.temperature > 0.0f))
    fail("build_distribution needs a temperature > 0 (got {}); greedy decoding uses argmax",
         params.temperature);
  size_t finite = 0;
  const bool best_first = params.top_k > 0 && keep_best_k(logits, size_t(params.top_k), out, finite);
  if (!best_first) every_finite(logits, out);
  finish_distribution(out, params, best_first);
}

void finish_distribution(std::vector<Candidate>& out, const SamplingParams& params, bool best_first) {
  if (out.empty())
    fail("every logit is -inf, so no token can be chosen; check logit_bias does not ban them all");

  if (params.top_p < 1.0f) keep_top_p(out, params.top_p, best_first);
  if (params.min_p > 0.0f) keep_min_p(out, params.min_p);

  const double total = set_weights(out, params.temperature);
  for (Candidate& c : out) c.p /= total;
}

}  // namespace detail

namespace {

// Inverse-CDF draw over the candidates in their given order.
int32_t draw(const std::vector<detail::Candidate>& candidates, double u) {
  double mass = 0.0;
  for (const detail::Candidate& c : candidates) {
    mass += c.p;
    if (u < mass) return c.id;
  }
  // u landed past the rounded total: the last token that can be drawn at all.
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it)
    if (it->p > 0.0) return it->id;
  return candidates.front().id;
}

// Whether a logit is NaN or +inf: one comparison a logit, which the compiler vectorizes.
bool any_invalid(std::span<const float> logits) {
  int invalid = 0;
  for (float x : logits) invalid |= !(x < std::numeric_limits<float>::infinity());
  return invalid != 0;
}

void check_logits(std::span<const float> logits, int64_t n_vocab) {
  if (int64_t(logits.size()) != n_vocab)
    fail("sampler got {} logits for a vocabulary of {}; pass one row of the model's output",
         logits.size(), n_vocab);
  if (!any_invalid(logits)) return;
  for (size_t i = 0; i < logits.size(); ++i)
    if (!(logits[i] < std::numeric_limits<float>::infinity()))
      fail("logit of token {} is {}: the model produced an invalid value (check the weights and "
           "the backend)", i, logits[i]);
}

}  // namespace

Sampler::Sampler(SamplingParams params, int64_t n_vocab)
    : params_(std::move(params)), n_vocab_(n_vocab), rng_(params_.seed) {
  validate(params_, n_vocab_);
}

int32_t greedy(std::span<const float> logits) {
  check_logits(logits, int64_t(logits.size()));
  return detail::argmax(logits);
}

int32_t greedy(const TopCandidates& top) {
  if (top.finite < 0)
    fail("a logit is NaN or +inf: the model produced an invalid value (check the weights and the backend)");
  if (top.best.empty())
    fail("every logit is -inf, so no token can be chosen; check logit_bias does not ban them all");
  detail::Candidate best{top.best.front().id, top.best.front().logit, 0.0};
  for (const Scored& c : top.best)
    if (detail::better({c.id, c.logit, 0.0}, best)) best = {c.id, c.logit, 0.0};
  return best.id;
}

TopCandidates top_candidates(std::span<const float> logits, int n, std::span<const int32_t> aside) {
  if (n < 1) fail("top_candidates: {} candidates asked for; ask for at least one", n);
  if (any_invalid(logits)) return {.best = {}, .finite = -1};  // (sample_top fails, as sample() does)
  std::vector<float> rest;  // the row with the ids set aside at -inf, which no candidate is
  if (!aside.empty()) {
    rest.assign(logits.begin(), logits.end());
    for (const int32_t id : aside) {
      if (id < 0 || size_t(id) >= logits.size())
        fail("top_candidates: id {} set aside is outside the vocabulary of {}", id, logits.size());
      rest[size_t(id)] = kMinusInf;
    }
  }
  const std::span<const float> row = aside.empty() ? logits : std::span<const float>(rest);
  std::vector<detail::Candidate> best;
  size_t finite = 0;
  if (!detail::keep_best_k(row, size_t(n), best, finite)) {  // every finite logit
    detail::every_finite(row, best);
    std::sort(best.begin(), best.end(), detail::better);
  }
  TopCandidates top{.finite = int64_t(finite)};
  for (const detail::Candidate& c : best) top.best.push_back({c.id, c.logit});
  for (const int32_t id : aside) top.aside.push_back({id, logits[size_t(id)]});
  return top;
}

namespace {

bool penalties_active(const SamplingParams& p) {
  return p.penalty_last_n != 0 && (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
}

// The position of `id` in the ascending ids (which hold it).
size_t position_in(const std::vector<int32_t>& ids, int32_t id) {
  return size_t(std::lower_bound(ids.begin(), ids.end(), id) - ids.begin());
}

}  // namespace

bool Sampler::takes_top() const {
  const bool changed = !params_.logit_bias.empty() || penalties_active(params_);
  if (!changed) return takes_top_with(0);
  // The ids set aside are at most the bias's and the penalty window's together: counted exactly (a
  // sort of the window, asked every token) only where that bound is over what the candidates take.
  const size_t bound = params_.logit_bias.size() + (penalties_active(params_) ? penalty_window().size() : 0);
  return takes_top_with(bound <= size_t(kTopAsideMost) ? bound : top_aside().size());
}

bool Sampler::takes_top_with(size_t aside) const {
  const SamplingParams& p = params_;
  const bool changed = !p.logit_bias.empty() || penalties_active(p);
  // (Greedy sampling with no bias and no penalty takes the greedy token alone: plain_greedy.)
  const bool sampling = p.temperature > 0.0f ? p.top_k > 0 && p.top_k <= kTopCandidates : changed;
  return sampling && aside <= size_t(kTopAsideMost);
}

std::vector<int32_t> Sampler::top_aside() const {
  std::vector<int32_t> ids;
  for (const auto& [id, bias] : params_.logit_bias) ids.push_back(id);
  if (penalties_active(params_)) {
    const std::span<const int32_t> window = penalty_window();
    ids.insert(ids.end(), window.begin(), window.end());
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// The candidates top-k leaves, as build_distribution makes them from the whole row: the k best,
// best first, where there are more than k finite logits; else every finite one, in token order
// (then `top` holds them all). The ids set aside get the bias and the penalties here, by the same
// functions as a whole row, on a row of their own: every other token keeps its logit, so the
// row's k best after the changes are among the best of the rest (k of them, or all there are)
// and the ids set aside.
int32_t Sampler::sample_top(const TopCandidates& top) {
  const std::vector<int32_t> aside = top_aside();  // (once: with a long penalty window it sorts the window)
  if (!takes_top_with(aside.size()))
    fail("sampler: sampling from top candidates needs a temperature > 0 and a top-k of 1 to {}, or greedy sampling "
         "with a logit bias or a penalty, and at most {} tokens that those change", kTopCandidates, kTopAsideMost);
  if (top.aside.size() != aside.size())
    fail("sampler: the top candidates set {} ids aside where the sampler changes {}", top.aside.size(), aside.size());
  for (size_t i = 0; i < aside.size(); ++i) {
    if (top.aside[i].id != aside[i])
      fail("sampler: the top candidates set id {} aside where the sampler wants {}", top.aside[i].id, aside[i]);
    if (!(top.aside[i].logit < std::numeric_limits<float>::infinity()))
      fail("logit of token {} is {}: the model produced an invalid value (check the weights and the backend)",
           aside[i], top.aside[i].logit);
  }
  if (top.finite < 0)
    fail("a logit is NaN or +inf: the model produced an invalid value (check the weights and the backend)");
  const size_t k = params_.temperature > 0.0f ? size_t(params_.top_k) : 1;  // (greedy: the best)
  if (top.best.size() < std::min(k, size_t(top.finite)) ||
      (top.finite <= int64_t(kTopCandidates) && int64_t(top.best.size()) != top.finite))
    fail("sampler: {} top candidates of a row with {} finite logits cannot decide a top-k of {}", top.best.size(),
         top.finite, k);
  candidates_.clear();
  for (const Scored& c : top.best) {
    if (c.id < 0 || c.id >= n_vocab_ || !(c.logit < std::numeric_limits<float>::infinity()) || c.logit == kMinusInf)
      fail("sampler: a top candidate ({}, {}) is not a finite logit of the vocabulary of {}", c.id, c.logit, n_vocab_);
    candidates_.push_back({c.id, c.logit, 0.0});
  }
  int64_t finite = top.finite;
  if (!aside.empty()) {
    work_.clear();
    for (const Scored& c : top.aside) work_.push_back(c.logit);
    std::vector<std::pair<int32_t, float>> bias;
    for (const auto& [id, b] : params_.logit_bias) bias.emplace_back(int32_t(position_in(aside, id)), b);
    detail::apply_logit_bias(work_, bias);
    if (penalties_active(params_)) {
      std::vector<int32_t> window;
      for (const int32_t t : penalty_window()) window.push_back(int32_t(position_in(aside, t)));
      detail::apply_penalties(work_, window, params_);
    }
    for (size_t i = 0; i < aside.size(); ++i) {
      if (work_[i] == kMinusInf) continue;
      if (!(work_[i] < std::numeric_limits<float>::infinity()))
        fail("the logit bias took token {}'s logit to {}; use a smaller bias", aside[i], work_[i]);
      candidates_.push_back({aside[i], work_[i], 0.0});
      ++finite;
    }
  }
  if (params_.temperature <= 0.0f) {  // greedy: the best of them (argmax's: the lowest id among equals)
    if (candidates_.empty())
      fail("every logit is -inf, so no token can be chosen; check logit_bias does not ban them all");
    return std::min_element(candidates_.begin(), candidates_.end(), detail::better)->id;
  }
  const bool cut = finite > int64_t(k);
  if (cut) {
    std::sort(candidates_.begin(), candidates_.end(), detail::better);
    candidates_.resize(k);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  }
  detail::finish_distribution(candidates_, params_, cut);
  return draw(candidates_, rng_.uniform());
}

bool Sampler::plain_greedy() const {
  const SamplingParams& p = params_;
  return p.temperature <= 0.0f && p.logit_bias.empty() && !penalties_active(p);
}

int32_t Sampler::sample(std::span<const float> logits) {
  check_logits(logits, n_vocab_);
  work_.assign(logits.begin(), logits.end());
  detail::apply_logit_bias(work_, params_.logit_bias);
  detail::apply_penalties(work_, penalty_window(), params_);
  if (params_.temperature <= 0.0f) return detail::argmax(work_);
  detail::build_distribution(work_, params_, candidates_);
  return draw(candidates_, rng_.uniform());
}

void Sampler::accept(int32_t token) {
  if (token < 0 || token >= n_vocab_)
    fail("accepted token {} is outside the vocabulary of {}", token, n_vocab_);
  history_.push_back(token);
  // Trim in batches so accepting stays O(1) amortized.
  const int last_n = params_.penalty_last_n;
  if (last_n >= 0 && history_.size() > 2 * size_t(last_n) + 64)
    history_.erase(history_.begin(), history_.end() - last_n);
}

void Sampler::reset() {
  history_.clear();
  rng_ = detail::Rng(params_.seed);
}

std::span<const int32_t> Sampler::penalty_window() const {
  std::span<const int32_t> all(history_);
  if (params_.penalty_last_n < 0) return all;
  return all.last(std::min(all.size(), size_t(params_.penalty_last_n)));
}

}  // namespace lode::sample
