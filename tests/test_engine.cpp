// The engine interface (engine/engine.h) on the CPU engine, lode-mini: a step of several rows gives
// every sequence the logits it gets alone; engine::prefill's chunks are the session's; checkpoints
// taken through the interface rewind and copy prefixes exactly; bad steps fail clearly.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "cpu/engine.h"
#include "gguf/reader.h"
#include "model/weights.h"
#include "sample/sampler.h"
#include "support/paths.h"
#include "test_gguf_helpers.h"

namespace {

using namespace lode;

class Engine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reader_ = new gguf::Reader(test::repo_root() / "models/lode-mini.gguf");
    const auto config = model::read_config(reader_->metadata());
    weights_ = new std::shared_ptr<const model::ModelWeights>(
        std::make_shared<const model::ModelWeights>(model::bind_weights(*reader_, config)));
  }
  static void TearDownTestSuite() {
    delete weights_;
    delete reader_;
  }
  // deltanet_chunk 0: the recurrent form everywhere, so equal tokens give bit-identical logits
  // whatever the chunking.
  static std::shared_ptr<engine::Model> model() {
    return cpu::CpuModel::make(*weights_, {.threads = 2, .max_context = 256, .deltanet_chunk = 0});
  }
  static inline gguf::Reader* reader_ = nullptr;
  static inline std::shared_ptr<const model::ModelWeights>* weights_ = nullptr;
};

const std::vector<int32_t> kPromptA{17, 400, 23, 99, 1024, 7, 7, 300, 12, 13};
const std::vector<int32_t> kPromptB{5, 6, 7, 8, 9, 10, 2000, 31};

TEST_F(Engine, EveryRowOfAStepGetsTheLogitsItGetsAlone) {
  const auto m = model();
  // Alone: A decodes one token after its prompt, B reads its prompt.
  const auto a_alone = m->open_sequence(), b_alone = m->open_sequence();
  engine::prefill(*a_alone, kPromptA, 0);
  const std::vector<float> a_next = engine::decode(*a_alone, 42);
  const std::vector<float> b_last = engine::prefill(*b_alone, kPromptB, 0);

  const auto a = m->open_sequence(), b = m->open_sequence();
  engine::prefill(*a, kPromptA, 0);
  const int32_t token = 42;
  engine::StepRow rows[] = {{a.get(), std::span(&token, 1), 1, {}}, {b.get(), kPromptB, 1, {}}};
  m->step(rows);
  EXPECT_EQ(rows[0].logits, a_next);
  EXPECT_EQ(rows[1].logits, b_last);
  EXPECT_EQ(a->position(), int64_t(kPromptA.size()) + 1);
  EXPECT_EQ(b->position(), int64_t(kPromptB.size()));
}

TEST_F(Engine, PrefillInChunksEqualsTheSessionsOwnChunks) {
  const auto m = model();
  const auto s = m->open_sequence();
  const std::vector<float> all = engine::prefill(*s, kPromptA, 3, true);
  ASSERT_EQ(all.size(), kPromptA.size() * size_t(m->vocab()));
  cpu::Session session(*weights_, {.threads = 2, .max_context = 256, .deltanet_chunk = 0});
  EXPECT_EQ(session.prefill(kPromptA, 3, true), all);
  s->reset();
  EXPECT_EQ(s->position(), 0);
  const std::vector<float> last = engine::prefill(*s, kPromptA, 4);
  EXPECT_EQ(last, std::vector<float>(all.end() - m->vocab(), all.end()));
}

TEST_F(Engine, CheckpointsRewindAndCopyPrefixesExactly) {
  const auto m = model();
  const auto s = m->open_sequence();
  engine::prefill(*s, kPromptA, 0);
  const std::shared_ptr<const engine::Checkpoint> at_prompt = s->checkpoint();
  EXPECT_EQ(at_prompt->position(), int64_t(kPromptA.size()));
  EXPECT_GT(at_prompt->bytes(), 0);
  const std::vector<float> first = engine::decode(*s, 42);
  engine::prefill(*s, kPromptB, 0);  // a detour
  s->rewind(*at_prompt);
  EXPECT_EQ(s->position(), int64_t(kPromptA.size()));
  EXPECT_EQ(engine::decode(*s, 42), first);

  const auto other = m->open_sequence();
  other->copy_prefix(*s, *at_prompt);
  EXPECT_EQ(other->position(), int64_t(kPromptA.size()));
  EXPECT_EQ(engine::decode(*other, 42), first);
  EXPECT_EQ(s->position(), int64_t(kPromptA.size()) + 1);  // the source is left as it was
  EXPECT_GT(other->kv_bytes(), 0);
}

// A greedy-only row gives the greedy token of the logits an identical sequence gets, and no logits;
// one for each of its logit rows (a verify window's); it needs a logit row.
TEST_F(Engine, GreedyOnlyRowsGiveTheLogitsGreedyToken) {
  const auto m = model();
  const auto a = m->open_sequence(), b = m->open_sequence();
  engine::prefill(*a, kPromptA, 0);
  engine::prefill(*b, kPromptA, 0);
  int32_t token = 77;
  for (int step = 0; step < 4; ++step) {
    const int32_t want = sample::greedy(engine::decode(*a, token));
    engine::StepRow row{.sequence = b.get(), .tokens = std::span(&token, 1), .greedy_only = true};
    m->step(std::span(&row, 1));
    EXPECT_EQ(row.greedy, std::vector<int32_t>{want}) << "step " << step;
    EXPECT_TRUE(row.logits.empty());
    token = row.greedy[0];
  }
  EXPECT_EQ(engine::decode_greedy(*b, token), sample::greedy(engine::decode(*a, token)));
  const std::vector<int32_t> window = {token, 5, 900, 41};
  for (const bool as_decode : {true, false}) {
    engine::StepRow logits{.sequence = a.get(), .tokens = window, .logit_rows = 4, .as_decode = as_decode};
    engine::StepRow greedy{.sequence = b.get(), .tokens = window, .logit_rows = 4, .as_decode = as_decode,
                           .greedy_only = true};
    m->step(std::span(&logits, 1));
    m->step(std::span(&greedy, 1));
    ASSERT_EQ(greedy.greedy.size(), 4u);
    for (size_t r = 0; r < 4; ++r)
      EXPECT_EQ(greedy.greedy[r], sample::greedy(std::span(logits.logits).subspan(r * size_t(m->vocab()), size_t(m->vocab()))))
          << "row " << r << (as_decode ? " as decode steps" : " as a prompt");
    EXPECT_TRUE(greedy.logits.empty());
  }
  engine::StepRow none{.sequence = b.get(), .tokens = std::span(&token, 1), .logit_rows = 0, .greedy_only = true};
  EXPECT_TRUE(test::fails_with([&] { m->step(std::span(&none, 1)); }, {"needs a logit row"}));
}

TEST_F(Engine, BadStepsFailSayingWhy) {
  const auto m = model();
  const auto s = m->open_sequence();
  const std::vector<int32_t> none;
  EXPECT_TRUE(test::fails_with([&] { engine::prefill(*s, none, 0); }, {"at least one token"}));
  const int32_t outside = int32_t(m->vocab());
  EXPECT_TRUE(test::fails_with([&] { engine::decode(*s, outside); }, {"outside the vocabulary"}));
  const int32_t token = 1;
  engine::StepRow twice[] = {{s.get(), std::span(&token, 1), 1, {}}, {s.get(), std::span(&token, 1), 1, {}}};
  EXPECT_TRUE(test::fails_with([&] { m->step(twice); }, {"twice"}));
  engine::StepRow nobody[] = {{nullptr, std::span(&token, 1), 1, {}}};
  EXPECT_TRUE(test::fails_with([&] { m->step(nobody); }, {"names no sequence"}));
  EXPECT_EQ(s->position(), 0);  // nothing ran
  EXPECT_EQ(m->info().backend, "cpu");
  EXPECT_EQ(m->info().threads, 2);
}

}  // namespace
