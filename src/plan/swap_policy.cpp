#include "plan/swap_policy.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace lode::plan {

SwapPolicy::SwapPolicy(int64_t n, SwapOptions options)
    : options_(options), scores_(size_t(n), 0.0), last_(size_t(n), 0) {}

void SwapPolicy::observe(std::span<const uint64_t> counts) {
  if (counts.size() != scores_.size()) fail("swap policy: {} counts for {} experts", counts.size(), scores_.size());
  for (size_t i = 0; i < scores_.size(); ++i) {
    scores_[i] = scores_[i] * options_.decay + double(counts[i] - last_[i]);
    last_[i] = counts[i];
  }
}

std::vector<std::pair<int64_t, int64_t>> SwapPolicy::choose(std::span<const Residency> where) const {
  if (where.size() != scores_.size()) fail("swap policy: {} places for {} experts", where.size(), scores_.size());
  std::vector<int64_t> absent, resident;
  for (size_t i = 0; i < where.size(); ++i) {
    if (where[i] == Residency::absent) absent.push_back(int64_t(i));
    if (where[i] == Residency::resident) resident.push_back(int64_t(i));
  }
  const size_t n = std::min({absent.size(), resident.size(), size_t(std::max<int64_t>(options_.per_round, 0))});
  // The n hottest absent, hottest first; the n coldest resident, coldest first (ties: lower index).
  const auto hotter = [&](int64_t a, int64_t b) { return scores_[a] != scores_[b] ? scores_[a] > scores_[b] : a < b; };
  const auto colder = [&](int64_t a, int64_t b) { return scores_[a] != scores_[b] ? scores_[a] < scores_[b] : a < b; };
  std::partial_sort(absent.begin(), absent.begin() + n, absent.end(), hotter);
  std::partial_sort(resident.begin(), resident.begin() + n, resident.end(), colder);
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (size_t i = 0; i < n; ++i) {
    const double hot = scores_[size_t(absent[i])], cold = scores_[size_t(resident[i])];
    if (hot < options_.ratio * cold + options_.floor) break;
    pairs.emplace_back(absent[i], resident[i]);
  }
  return pairs;
}

}  // namespace lode::plan
