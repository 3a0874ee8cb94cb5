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
#include <string>
#include <vector>

#include "cpu/engine.h"
#include "engine/generate.h"
#include "gguf/reader.h"
#include "model/synth.h"
#include "model/weights.h"
#include "sample/sampler.h"
#include "support/paths.h"
#include "support/run_lode.h"
#include "test_gguf_helpers.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace lode;

struct Loaded {
  explicit Loaded(const std::filesystem::path& path)
      : reader(path), config(model::read_config(reader.metadata())),
        weights(std::make_shared<const model::ModelWeights>(model::bind_weights(reader, config))),
        text(tokenizer::Tokenizer::from_metadata(reader.metadata())) {}
  gguf::Reader reader;
  model::Qwen35MoeConfig config;
  std::shared_ptr<const model::ModelWeights> weights;
  tokenizer::Tokenizer text;
};

const Loaded& mini() {
  static const Loaded loaded(test::repo_root() / "models/lode-mini.gguf");
  return loaded;
}

struct Generated {
  std::vector<int32_t> tokens;
  std::string text;
  engine::GenerateResult result;
};

Generated generate(const Loaded& m, const std::string& prompt, int64_t mtp, kv::Format format, float temperature,
             uint64_t seed, int64_t max_tokens = 48) {
  auto sequence = cpu::open_sequence(m.weights, {.threads = 2, .max_context = 512, .kv_format = format});
  engine::GenerateOptions g;
  g.max_tokens = max_tokens;
  g.sampling.temperature = temperature;
  g.sampling.seed = seed;
  g.stop_at_end_of_generation = false;
  g.mtp = mtp;
  sample::Sampler sampler(g.sampling, m.config.vocab);
  Generated r;
  r.result = engine::generate(*sequence, m.text, sampler, m.text.encode(prompt, false), g,
                              [&](std::string_view piece) { r.text += piece; });
  r.tokens = r.result.tokens;
  return r;
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

// Teacher-forced on lode-mini's held-out sample: the block's draft for position p+1 (from the
// model's state at p-1 and the token at p) against the model's own greedy token after p.
TEST(Mtp, TheBlocksDraftsAgreeWithTheModelAsInTraining) {
  const Loaded& m = mini();
  const std::string text = test::slurp(test::repo_root() / "tests/data/mini/heldout_sample.txt").substr(0, 4000);
  std::vector<int32_t> tokens = m.text.encode(text, false);
  tokens.resize(std::min<size_t>(tokens.size(), 600));
  auto sequence = cpu::open_sequence(m.weights, {.threads = 2, .max_context = 1024});
  engine::StepRow row{.sequence = sequence.get(), .tokens = tokens, .logit_rows = int64_t(tokens.size()),
                      .want_hidden = true};
  sequence->model().step(std::span(&row, 1));
  engine::Drafter& drafter = sequence->drafter();
  const int64_t vocab = m.config.vocab, hidden = m.config.hidden;
  int64_t agree = 0, n = 0;
  for (size_t p = 0; p + 1 < tokens.size(); ++p) {
    if (p > 0) {
      const std::vector<int32_t> draft = drafter.draft(tokens[p], 1, 0.0f);
      ASSERT_EQ(draft.size(), 1u);
      agree += draft[0] == sample::detail::argmax(std::span(row.logits).subspan(p * size_t(vocab), size_t(vocab)));
      ++n;
    }
    drafter.advance(std::span(&tokens[p], 1), std::span(row.hidden).subspan(p * size_t(hidden), size_t(hidden)));
  }
  const double share = double(agree) / double(n);
  std::printf("MTP drafts agreeing with the model's greedy next token: %.1f%% of %lld positions\n", 100 * share,
              static_cast<long long>(n));
  EXPECT_GT(share, 0.45);
  EXPECT_LT(share, 0.75);
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
