// Session::checkpoint / rewind, the engine's half of prefix reuse: going back to an earlier point
// of a sequence and continuing gives exactly what a fresh run over the same tokens gives.
#include <gtest/gtest.h>

#include "core/error.h"
#include "cpu/session.h"
#include "gguf/reader.h"
#include "model/qwen35moe.h"
#include "support/paths.h"

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

}  // namespace
