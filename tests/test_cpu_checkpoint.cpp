// Session::checkpoint / rewind, the engine's half of prefix reuse: going back to an earlier point
// of a sequence and continuing gives exactly what a fresh run over the same tokens gives; and
// Session::cut_window, which goes back within the verify window just run.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kv/format.h"
#include "cpu/session.h"
#include "gguf/reader.h"
#include "model/qwen35moe.h"
#include "support/paths.h"
#include "test_gguf_helpers.h"

namespace {

namespace fs = std::filesystem;
const fs::path kMini = lode::test::repo_root() / "models/lode-mini.gguf";

class Checkpoint : public ::testing::Test {
 protected:
  Checkpoint() : reader_(kMini), config_(lode::model::read_config(reader_.metadata())) {}
  // deltanet_chunk 0: the recurrent form everywhere, so equal work gives bit-identical logits.
  lode::cpu::Session session() { return lode::cpu::Session(reader_, config_, {.threads = 1, .deltanet_chunk = 0}); }
  lode::gguf::Reader reader_;
  lode::model::Qwen35MoeConfig config_;
};

TEST_F(Checkpoint, RewindThenContinueEqualsAFreshRun) {
  const std::vector<int32_t> prefix{17, 400, 23, 99, 1024, 7, 7, 300}, detour{5, 6, 7, 8, 9, 10}, suffix{42, 43, 2000};
  lode::cpu::Session s = session();
  s.prefill(prefix);
  const auto cp = s.checkpoint();
  s.prefill(detour);
  s.decode(11);
  s.rewind(cp);
  EXPECT_EQ(s.position(), int64_t(prefix.size()));
  const std::vector<float> resumed = s.prefill(suffix, 64, true);

  lode::cpu::Session fresh = session();
  fresh.prefill(prefix);
  EXPECT_EQ(fresh.prefill(suffix, 64, true), resumed);  // bit for bit
}

TEST_F(Checkpoint, RewindToTheStartEqualsAReset) {
  lode::cpu::Session s = session();
  const auto start = s.checkpoint();
  s.prefill(std::vector<int32_t>{1, 2, 3, 4});
  s.rewind(start);
  lode::cpu::Session fresh = session();
  const std::vector<int32_t> tokens{9, 8, 7};
  EXPECT_EQ(s.prefill(tokens), fresh.prefill(tokens));
}

TEST_F(Checkpoint, HoldsOnlyTheRecurrentStatesAndRefusesToGoForward) {
  lode::cpu::Session s = session();
  s.prefill(std::vector<int32_t>{1, 2, 3});
  const auto cp = s.checkpoint();
  // Every DeltaNet layer's conv window and recurrent state, nothing that grows with the position.
  int64_t expect = 0;
  for (int64_t layer = 0; layer < config_.n_layers; ++layer)
    if (config_.block_is_recurrent(layer))
      expect += (config_.conv_channels() * (config_.ssm_conv_kernel - 1) +
                 config_.ssm_dt_rank * config_.ssm_state * config_.ssm_state) * int64_t(sizeof(float));
  EXPECT_EQ(cp.bytes(), expect);
  s.reset();
  EXPECT_THROW(s.rewind(cp), lode::Error);  // position 3 is ahead of an empty sequence
}

// A verify window (several tokens run as decode steps) cut to its first j tokens (1..n) leaves the
// state j one-token steps leave, in every K/V format: the next step gives the same bits; a cut
// window can be cut again, shorter. Cuts without a window, of no tokens or longer than it, are
// refused.
TEST_F(Checkpoint, ACutWindowLeavesTheStateOfTheTokensItKeeps) {
  for (lode::kv::Format format : lode::kv::all_formats()) {
    SCOPED_TRACE(lode::kv::to_string(format));
    const lode::cpu::SessionOptions options{.threads = 1, .kv_format = format};
    lode::cpu::Session a(reader_, config_, options), b(reader_, config_, options);
    const std::vector<int32_t> prompt{17, 400, 23, 99, 1024, 7, 7, 300, 12};
    a.prefill(prompt);
    b.prefill(prompt);
    int32_t next = 500;
    // (window tokens, tokens kept, then kept again after a second cut; -1: no second cut)
    for (const auto& [n, keep, again] : std::vector<std::tuple<int, int, int>>{
             {4, 1, -1}, {3, 1, -1}, {4, 4, 2}, {2, 2, 1}, {4, 3, 1}, {3, 2, -1}, {2, 1, -1}}) {
      SCOPED_TRACE(std::to_string(n) + " tokens, keeping " + std::to_string(keep) + " then " + std::to_string(again));
      std::vector<int32_t> window;
      for (int i = 0; i < n; ++i) window.push_back(next++);
      lode::cpu::BatchEntry entry{.session = &a, .tokens = window, .logit_rows = 0, .as_decode = true};
      lode::cpu::Session::forward_batch(std::span(&entry, 1));
      a.cut_window(keep);
      if (again >= 0) a.cut_window(again);
      const int kept = again >= 0 ? again : keep;
      for (int t = 0; t < kept; ++t) b.decode(window[size_t(t)]);
      ASSERT_EQ(a.position(), b.position());
      EXPECT_EQ(a.decode(next), b.decode(next));  // bit for bit
      ++next;
    }
    const auto refused = [&](int64_t keep, const char* why) {
      return lode::test::fails_with([&] { a.cut_window(keep); }, {why});
    };
    EXPECT_TRUE(refused(0, "no verify window"));  // the last step was one token
    const std::vector<int32_t> three{5, 6, 7};
    lode::cpu::BatchEntry entry{.session = &a, .tokens = three, .logit_rows = 0, .as_decode = true};
    lode::cpu::Session::forward_batch(std::span(&entry, 1));
    EXPECT_TRUE(refused(4, "cannot keep 4 tokens of a window of 3"));
    EXPECT_TRUE(refused(0, "cannot keep 0 tokens of a window of 3 (a cut keeps 1 to 3)"));
    a.prefill(three);  // a prompt chunk is no window
    EXPECT_TRUE(refused(1, "no verify window"));
  }
}

}  // namespace
