// Where the server cuts prompts (server/prompt_cuts.h): multiples of the step, and turn starts far
// enough from the cuts around them and from the end; and the property prefix reuse rests on: a
// checkpoint taken at a cut of one prompt, reused for another that shares the tokens before it and
// cuts there too, has the other's cuts before it.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "server/prompt_cuts.h"

namespace lode::test {
namespace {

constexpr int32_t kTurn = 7;

std::vector<int64_t> cuts_of(const server::PromptCuts& cuts, const std::vector<int32_t>& prompt) {
  std::vector<int64_t> out;
  for (int64_t at = 0; at < int64_t(prompt.size());) out.push_back(at = cuts.next(prompt, at));
  return out;
}

std::vector<int32_t> with_turns(int64_t size, std::initializer_list<int64_t> turns) {
  std::vector<int32_t> prompt(size_t(size), 1);
  for (int64_t t : turns) prompt[size_t(t)] = kTurn;
  return prompt;
}

TEST(PromptCuts, MultiplesOfTheStepAndTurnsFarFromOtherCuts) {
  const server::PromptCuts cuts{.step = 256, .checkpoint_every = 512, .turn_start = kTurn};
  // 100: a turn 64 or more past 0 and short of 256; 130: too close to 100; 300: too close to 256;
  // 450: too close to 512; 560: too close to 512; 600: taken; 660: too close to 600; 700: fewer than
  // 64 before the end.
  const auto prompt = with_turns(720, {0, 100, 130, 300, 450, 560, 600, 660, 700});
  EXPECT_EQ(cuts_of(cuts, prompt), (std::vector<int64_t>{100, 256, 512, 600, 720}));
  EXPECT_TRUE(cuts.keeps_checkpoint(100));   // a turn
  EXPECT_FALSE(cuts.keeps_checkpoint(256));  // a multiple of the step, not of checkpoint_every
  EXPECT_TRUE(cuts.keeps_checkpoint(512));
  EXPECT_TRUE(cuts.keeps_checkpoint(600));
  for (int64_t at : {100, 256, 512, 600}) EXPECT_TRUE(cuts.is_cut(prompt, at)) << at;
  for (int64_t at : {0, 130, 300, 450, 560, 660, 700, 720}) EXPECT_FALSE(cuts.is_cut(prompt, at)) << at;
  // Without a turn token, the multiples of the step alone.
  const server::PromptCuts grid{.step = 256, .checkpoint_every = 256};
  EXPECT_EQ(cuts_of(grid, prompt), (std::vector<int64_t>{256, 512, 720}));
  EXPECT_TRUE(grid.is_cut(prompt, 512));
  EXPECT_FALSE(grid.is_cut(prompt, 100));
}

// Two prompts that share a random prefix, each with random turn starts: every cut of the first
// that lies within the shared part and is a cut of the second (what PrefixCache reuses) has the
// same cuts before it in both.
TEST(PromptCuts, ACheckpointOnACutOfTheNewPromptHasItsCutsBeforeIt) {
  std::mt19937 random(5);
  const server::PromptCuts cuts{.step = 256, .checkpoint_every = 256, .turn_start = kTurn};
  int64_t reused = 0;
  for (int round = 0; round < 2000; ++round) {
    const auto draw = [&](size_t size) {
      std::vector<int32_t> p(size);
      for (auto& t : p) t = random() % 40 == 0 ? kTurn : 1;
      return p;
    };
    std::vector<int32_t> a = draw(1 + random() % 1200), b = draw(1 + random() % 1200);
    const size_t shared = std::min<size_t>(random() % 1200, std::min(a.size(), b.size()));
    std::copy(a.begin(), a.begin() + ptrdiff_t(shared), b.begin());
    const auto in_a = cuts_of(cuts, a), in_b = cuts_of(cuts, b);
    for (int64_t at : in_a) {
      if (at >= int64_t(a.size()) || at > int64_t(shared) || !cuts.is_cut(b, at)) continue;
      ++reused;
      std::vector<int64_t> before_a, before_b;
      for (int64_t c : in_a) if (c < at) before_a.push_back(c);
      for (int64_t c : in_b) if (c < at) before_b.push_back(c);
      ASSERT_EQ(before_a, before_b) << "round " << round << ", cut " << at;
    }
  }
  EXPECT_GT(reused, 1000);  // (the rounds did reuse checkpoints)
}

}  // namespace
}  // namespace lode::test
