// Speculative decoding with the model's MTP block on the CPU engine (cpu/mtp.h, engine/generate.h
// GenerateOptions::mtp):
// - the output with drafts is the output without, token for token: greedy in every K/V format on
//   lode-mini (a trained MTP block) and on a tiny synth (a random one that drafts badly), and
//   sampled with the same seed (each token is drawn from the model's own logits either way, so a
//   rule that accepted drafts without sampling would fail here);
// - the block itself is right: lode-mini's drafts agree with the model's next greedy token about as
//   often as training measured (docs/MINI.md: 56.7%);
// - a file without the block is refused, saying so.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cpu/engine.h"
#include "cpu/mtp.h"
#include "engine/generate.h"
#include "gguf/reader.h"
#include "model/synth.h"
#include "model/weights.h"
#include "sample/sampler.h"
#include "support/mtp_fixtures.h"
#include "support/paths.h"
#include "support/run_lode.h"
#include "test_gguf_helpers.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace lode;

using Loaded = test::LoadedFile;
using test::mini;

using test::Generated;

Generated generate(const Loaded& m, const std::string& prompt, int64_t mtp, kv::Format format, float temperature,
             uint64_t seed, int64_t max_tokens = 48) {
  auto sequence = cpu::open_sequence(m.weights, {.threads = 2, .max_context = 512, .kv_format = format});
  return test::generate_on(*sequence, m, prompt, mtp, temperature, seed, max_tokens);
}

TEST(Mtp, GreedyOutputIsTheSameWithDraftsInEveryKvFormat) {
  const std::string prompt = "The shell reads a line of text and";
  for (kv::Format format : kv::all_formats()) {
    SCOPED_TRACE(kv::to_string(format));
    const Generated plain = generate(mini(), prompt, 0, format, 0.0f, 1);
    for (int64_t n : {1, 3}) {
      const Generated drafted = generate(mini(), prompt, n, format, 0.0f, 1);
      EXPECT_EQ(drafted.tokens, plain.tokens) << "--mtp " << n;
      EXPECT_EQ(drafted.text, plain.text) << "--mtp " << n;
      EXPECT_GT(drafted.result.windows, 0);
      EXPECT_GT(drafted.result.accepted, 0) << "a trained block's drafts are sometimes right";
      EXPECT_LT(drafted.result.windows, int64_t(plain.tokens.size()) - 1) << "fewer steps than tokens";
    }
  }
}

// --mtp-min-p: drafting stops where the block's best token is less likely than that; at 1 nothing
// is drafted, at 0.5 only some, and the output is the same.
TEST(Mtp, TheMinimumProbabilityStopsDrafting) {
  const std::string prompt = "The shell reads a line of text and";
  const Generated plain = generate(mini(), prompt, 0, kv::Format::f16, 0.0f, 1);
  const Generated all = generate(mini(), prompt, 3, kv::Format::f16, 0.0f, 1);
  int64_t drafted[2] = {};
  for (int i = 0; i < 2; ++i) {
    auto sequence = cpu::open_sequence(mini().weights, {.threads = 2, .max_context = 512});
    const Generated r = test::generate_on(*sequence, mini(), prompt, 3, 0.0f, 1, 48, i == 0 ? 1.0f : 0.5f);
    EXPECT_EQ(r.tokens, plain.tokens);
    drafted[i] = r.result.drafted;
  }
  EXPECT_EQ(drafted[0], 0);
  EXPECT_GT(drafted[1], 0);
  EXPECT_LT(drafted[1], all.result.drafted);
}

TEST(Mtp, SampledOutputIsTheSameWithDraftsForEverySeed) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    const Generated plain = generate(mini(), "Files and directories", 0, kv::Format::f16, 0.9f, seed, 24);
    const Generated drafted = generate(mini(), "Files and directories", 4, kv::Format::f16, 0.9f, seed, 24);
    EXPECT_EQ(drafted.tokens, plain.tokens);
  }
}

TEST(Mtp, ARandomBlockDraftsBadlyButChangesNothing) {
  const test::TempDir dir;
  model::SynthOptions o;
  o.layers = 4;
  o.mtp = true;
  o.seed = 3;
  model::write_synth(dir / "tiny.gguf", o);
  const Loaded tiny(dir / "tiny.gguf");
  const Generated plain = generate(tiny, "a b c", 0, kv::Format::f32, 0.0f, 1, 32);
  const Generated drafted = generate(tiny, "a b c", 2, kv::Format::f32, 0.0f, 1, 32);
  EXPECT_EQ(drafted.tokens, plain.tokens);
  EXPECT_GT(drafted.result.drafted, 0);
}

// A conversation that goes on (the pending last token fed with the next turn), a stop string and a
// token limit that fall inside a window: still the output without drafts, and the drafter still
// follows the sequence (its second turn drafts and is accepted).
TEST(Mtp, AConversationStopStringsAndLimitsInsideAWindowChangeNothing) {
  const Loaded& m = mini();
  const auto turns = [&](int64_t mtp) {
    auto sequence = cpu::open_sequence(m.weights, {.threads = 2, .max_context = 512});
    std::vector<std::string> texts;
    std::vector<int32_t> carry;
    int64_t second_accepted = 0;
    for (const char* turn : {"The shell reads", " Then the file"}) {
      engine::GenerateOptions g;
      g.max_tokens = 13;  // not a multiple of any window
      g.sampling.temperature = 0;
      g.stop_strings = {"ls("};
      g.mtp = mtp;
      sample::Sampler sampler(g.sampling, m.config.vocab);
      std::vector<int32_t> prompt = carry;
      const std::vector<int32_t> more = m.text.encode(turn, false);
      prompt.insert(prompt.end(), more.begin(), more.end());
      std::string text;
      const auto r = engine::generate(*sequence, m.text, sampler, prompt, g, [&](std::string_view t) { text += t; });
      texts.push_back(text);
      carry.assign(r.last_token_pending ? 1 : 0, r.tokens.empty() ? 0 : r.tokens.back());
      second_accepted = r.accepted;
    }
    return std::make_pair(texts, second_accepted);
  };
  const auto plain = turns(0), drafted = turns(3);
  EXPECT_EQ(drafted.first, plain.first);
  EXPECT_GT(drafted.second, 0) << "the second turn's drafts follow the conversation";
}

// A text sink that fails (a client gone) inside a window: the failure comes through, and the
// sequence holds what it holds without drafts when the sink fails at the same text (the window cut
// after the token whose sample failed), so the next step gives the same logits.
TEST(Mtp, ASinkThatFailsInsideAWindowLeavesTheSequenceAsWithoutDrafts) {
  const Loaded& m = mini();
  struct SinkGone {};
  const auto failing_at = [&](int64_t mtp, int calls) {
    auto sequence = cpu::open_sequence(m.weights, {.threads = 2, .max_context = 512});
    engine::GenerateOptions g;
    g.max_tokens = 40;
    g.sampling.temperature = 0;
    g.mtp = mtp;
    sample::Sampler sampler(g.sampling, m.config.vocab);
    int called = 0;
    const std::vector<int32_t> prompt = m.text.encode("The shell reads a line of text and", false);
    EXPECT_THROW(engine::generate(*sequence, m.text, sampler, prompt, g,
                                  [&](std::string_view) {
                                    if (++called == calls) throw SinkGone{};
                                  }),
                 SinkGone);
    const int64_t position = sequence->position();
    return std::make_pair(position, engine::decode(*sequence, 11));
  };
  for (int calls : {2, 5, 9}) {
    SCOPED_TRACE("failing at the sink's call " + std::to_string(calls));
    const auto plain = failing_at(0, calls), drafted = failing_at(3, calls);
    EXPECT_EQ(drafted.first, plain.first);
    EXPECT_EQ(drafted.second, plain.second);  // bit for bit
  }
}

// Steering that begins inside a window (its `after` token sampled from a row that is not the
// window's last): greedy windows give greedy tokens, not logits, and steering needs the logits, so
// the window stops there and the steered token is sampled from the next step's logits. The output
// is the output without drafts, and the steered choice is in it.
TEST(Mtp, SteeringThatBeginsInsideAWindowChangesNothing) {
  const Loaded& m = mini();
  const std::string prompt = "The shell reads a line of text and";
  const auto run = [&](int64_t mtp, std::optional<engine::SteeredText> steer) {
    auto sequence = cpu::open_sequence(m.weights, {.threads = 2, .max_context = 512});
    engine::GenerateOptions g;
    g.max_tokens = 32;
    g.sampling.temperature = 0;
    g.stop_at_end_of_generation = false;
    g.steer = std::move(steer);
    g.mtp = mtp;
    sample::Sampler sampler(g.sampling, m.config.vocab);
    Generated r;
    r.result = engine::generate(*sequence, m.text, sampler, m.text.encode(prompt, false), g,
                                [&](std::string_view t) { r.text += t; });
    r.tokens = r.result.tokens;
    return r;
  };
  const Generated plain = run(0, std::nullopt);
  ASSERT_GE(plain.tokens.size(), 12u);
  for (const size_t at : {4, 5, 6, 9}) {
    const engine::SteeredText steer{.after = plain.tokens[at], .choices = {" banana split", " cherry"}};
    const Generated without = run(0, steer), with = run(3, steer);
    EXPECT_EQ(with.tokens, without.tokens) << "steering after token " << at;
    EXPECT_EQ(with.text, without.text);
    EXPECT_TRUE(without.text.find(" banana split") != std::string::npos || without.text.find(" cherry") != std::string::npos)
        << without.text;
    EXPECT_GT(with.result.accepted, 0);
  }
}

// Teacher-forced on lode-mini's held-out sample (support/mtp_fixtures.h): the block's drafts agree
// with the model's next greedy token about as often as training measured.
TEST(Mtp, TheBlocksDraftsAgreeWithTheModelAsInTraining) {
  auto sequence = cpu::open_sequence(mini().weights, {.threads = 2, .max_context = 1024});
  const double share = test::held_out_agreement(*sequence);
  EXPECT_GT(share, 0.45);
  EXPECT_LT(share, 0.75);
}

// Drafts for several sequences in steps of the block over a row of each (MtpDrafter::draft_together,
// the CPU server's) are each drafter's own: different numbers wanted (none for one), a minimum
// probability for another, one drafter that has followed nothing, one begun part way.
TEST(Mtp, DraftersOfSeveralSequencesDraftTogetherAsAlone) {
  const Loaded& m = mini();
  const char* texts[] = {"The ls command lists the files of a folder, and with -l", "To copy a file keep its name: cp",
                         "grep finds lines that match a pattern in", "A folder's disk usage: du -sh"};
  auto model = cpu::CpuModel::make(m.weights, {.threads = 2, .max_context = 256});
  std::vector<std::unique_ptr<engine::Sequence>> sequences;
  std::vector<engine::Drafter*> drafters;
  std::vector<int32_t> pending;
  for (int q = 0; q < 4; ++q) {
    const std::vector<int32_t> tokens = m.text.encode(texts[q], false);
    sequences.push_back(model->open_sequence());
    engine::Drafter& drafter = sequences.back()->drafter();
    const size_t from = q == 1 ? tokens.size() - 5 : 0;  // (the second begun 5 tokens back)
    if (from > 0) engine::prefill(*sequences.back(), std::span(tokens).first(from), 0);
    drafter.reset(int64_t(from));
    engine::prefill(*sequences.back(), std::span(tokens).subspan(from), 0, false,
                    [&](std::span<const int32_t> chunk, std::span<const float> hidden) { drafter.advance(chunk, hidden); });
    drafters.push_back(&drafter), pending.push_back(tokens[size_t(q)]);
  }
  sequences.push_back(model->open_sequence());  // (nothing followed)
  drafters.push_back(&sequences.back()->drafter()), pending.push_back(pending.front());
  const std::vector<int64_t> n = {4, 2, 0, 3, 2};
  const std::vector<float> min_p = {0, 0, 0, 0.5f, 0};
  std::vector<engine::DraftAsk> asks;
  for (size_t i = 0; i < 5; ++i) asks.push_back({drafters[i], pending[i], n[i], min_p[i]});
  const std::vector<std::vector<int32_t>> together = model->draft_together(asks);
  test::expect_drafts_as_alone(together, drafters, pending, n, min_p);
  // The drafters' caches hold what they followed, no draft's rows: drafting again gives the same.
  EXPECT_EQ(model->draft_together(asks), together);
}

// A draft row's K/V row (mtp_forward_rows, every draft's step) is the row its token and state get
// when a drafter follows them at that position (mtp_append): the rotary positions of the two paths
// agree, for rows of several caches each at its own position.
TEST(Mtp, ADraftRowsKeysAndValuesAreThoseItsTokenGetsWhenFollowed) {
  const Loaded& m = mini();
  const model::Qwen35MoeConfig& c = m.config;
  const kv::Format format = kv::mtp_format(c.head_dim, kv::Format::f32);
  const cpu::Compute compute{.threads = 2};
  std::mt19937 random(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> hidden(size_t(2 * c.hidden));
  for (float& x : hidden) x = normal(random);
  const std::vector<int32_t> tokens = {17, 301};
  const std::vector<int64_t> positions = {7, 40};  // (each cache empty: the rotation all the row's)
  cpu::KvCache drafted[2] = {{format, c.n_kv_heads, c.head_dim}, {format, c.n_kv_heads, c.head_dim}};
  std::vector<cpu::KvCache*> caches = {&drafted[0], &drafted[1]};
  std::vector<float> out(size_t(2 * c.hidden)), logits(size_t(2 * c.vocab));
  cpu::mtp_forward_rows(*m.weights, *m.weights->mtp, caches, hidden.data(), tokens.data(), positions.data(), compute,
                        out.data(), logits.data());
  std::vector<float> a(size_t(c.head_dim)), b(a.size());
  for (size_t t = 0; t < 2; ++t) {
    cpu::KvCache followed(format, c.n_kv_heads, c.head_dim);
    cpu::mtp_append(*m.weights, *m.weights->mtp, followed, hidden.data() + t * size_t(c.hidden), &tokens[t], 1,
                    positions[t], compute);
    ASSERT_EQ(drafted[t].positions(), 1);
    for (int64_t head = 0; head < c.n_kv_heads; ++head) {
      drafted[t].key(0, head, a.data()), followed.key(0, head, b.data());
      EXPECT_EQ(a, b) << "row " << t << ", key head " << head;
      drafted[t].value(0, head, a.data()), followed.value(0, head, b.data());
      EXPECT_EQ(a, b) << "row " << t << ", value head " << head;
    }
  }
}

TEST(Mtp, AFileWithoutTheBlockIsRefusedSayingSo) {
  const test::TempDir dir;
  model::SynthOptions o;
  o.layers = 2;
  model::write_synth(dir / "plain.gguf", o);
  const auto r = test::run_lode("run -m '" + (dir / "plain.gguf").string() + "' -p 'a b' -n 4 --backend cpu --mtp 2",
                                dir.path());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("no MTP block"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("blk.2.nextn"), std::string::npos) << r.err;
}

}  // namespace
