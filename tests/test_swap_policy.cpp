// The adaptive placement's policy (plan/swap_policy.h): decayed routing scores, the hottest absent
// experts replacing the coldest resident ones while the difference is clear, at most per_round,
// never touching experts on their way in or out.
#include <gtest/gtest.h>

#include <vector>

#include "plan/swap_policy.h"

namespace {

using lode::plan::Residency;
using lode::plan::SwapOptions;
using lode::plan::SwapPolicy;

TEST(SwapPolicy, ScoresDecayAndAddTheNewRoutings) {
  SwapPolicy p(3, {.decay = 0.5});
  p.observe(std::vector<uint64_t>{4, 0, 2});
  p.observe(std::vector<uint64_t>{6, 8, 2});  // +2, +8, +0
  EXPECT_DOUBLE_EQ(p.scores()[0], 4 * 0.5 + 2);
  EXPECT_DOUBLE_EQ(p.scores()[1], 8);
  EXPECT_DOUBLE_EQ(p.scores()[2], 2 * 0.5);
}

TEST(SwapPolicy, HotAbsentExpertsReplaceColdResidentOnesInOrder) {
  SwapPolicy p(6, {.per_round = 8, .ratio = 2.0, .floor = 1.0});
  p.observe(std::vector<uint64_t>{100, 0, 50, 3, 1, 40});
  const std::vector<Residency> where = {Residency::absent,   Residency::resident, Residency::absent,
                                        Residency::resident, Residency::resident, Residency::busy};
  // Hottest absent: 0 (100), 2 (50); coldest resident: 1 (0), 4 (1), 3 (3). 100 >= 2*0+1, 50 >= 2*1+1.
  const auto pairs = p.choose(where);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0], std::make_pair(int64_t(0), int64_t(1)));
  EXPECT_EQ(pairs[1], std::make_pair(int64_t(2), int64_t(4)));
}

TEST(SwapPolicy, SmallDifferencesAndTheRoundsLimitHoldSwapsBack) {
  SwapPolicy close(4, {.per_round = 8, .ratio = 2.0, .floor = 16.0});
  close.observe(std::vector<uint64_t>{20, 10, 30, 12});
  EXPECT_TRUE(close.choose(std::vector<Residency>{Residency::absent, Residency::resident, Residency::absent,
                                                        Residency::resident}).empty());
  SwapPolicy limited(6, {.per_round = 1, .ratio = 1.0, .floor = 0.0});
  limited.observe(std::vector<uint64_t>{9, 0, 8, 0, 7, 0});
  const auto pairs = limited.choose(std::vector<Residency>{Residency::absent, Residency::resident, Residency::absent, Residency::resident,
                                     Residency::absent, Residency::resident});
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0].first, 0);
}

TEST(SwapPolicy, CountsOfAnotherSizeAreRefused) {
  SwapPolicy p(4, {});
  EXPECT_ANY_THROW(p.observe(std::vector<uint64_t>{1, 2}));
  EXPECT_ANY_THROW(p.choose(std::vector<Residency>(3, Residency::absent)));
}

}  // namespace
