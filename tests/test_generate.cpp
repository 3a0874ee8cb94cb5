// engine::generate on a synthesized tiny model (random weights, the synth byte-level vocabulary):
// greedy generation equals the plain argmax loop, stop strings and end-of-generation tokens stop
// it where they should, and a seed reproduces a sampled run.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "cpu/engine.h"
#include "engine/generate.h"
#include "engine/generation.h"
#include "model/synth.h"
#include "test_gguf_helpers.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace lode;

class Generate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    model::SynthOptions o;
    o.layers = 2;
    o.seed = 11;
    model::write_synth(*dir_ / "tiny.gguf", o);
    reader_ = new gguf::Reader(*dir_ / "tiny.gguf");
    tokenizer_ = new tokenizer::Tokenizer(tokenizer::Tokenizer::from_metadata(reader_->metadata()));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete reader_;
    delete dir_;
  }
  static cpu::Session session() { return cpu::Session(*reader_, model::read_config(reader_->metadata()), {.threads = 1}); }
  static engine::GenerateOptions greedy(int64_t n) {
    engine::GenerateOptions g;
    g.max_tokens = n;
    g.sampling.temperature = 0;
    return g;
  }
  static engine::GenerateResult run(const engine::GenerateOptions& g, std::string* text) {
    cpu::Session s = session();
    sample::Sampler sampler(g.sampling, s.vocab());
    const auto prompt = tokenizer_->encode("The weather today", false);
    return engine::generate(*cpu::borrow_sequence(s), *tokenizer_, sampler, prompt, g, [&](std::string_view piece) { *text += piece; });
  }

  static inline test::TempDir* dir_ = nullptr;
  static inline gguf::Reader* reader_ = nullptr;
  static inline tokenizer::Tokenizer* tokenizer_ = nullptr;
};

TEST_F(Generate, GreedyEqualsTheArgmaxLoopAndStreamsTheDecodedText) {
  std::string text;
  auto g = greedy(12);
  g.stop_at_end_of_generation = false;
  const auto result = run(g, &text);

  cpu::Session s = session();
  std::vector<float> logits = s.prefill(tokenizer_->encode("The weather today", false));
  std::vector<int32_t> expect;
  for (int i = 0; i < 12; ++i) {
    if (i) logits = s.decode(expect.back());
    expect.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  EXPECT_EQ(result.tokens, expect);
  EXPECT_EQ(result.finish, engine::FinishReason::length);
  EXPECT_EQ(text, tokenizer_->decode(expect, false));
}

// The CPU engine has no steps to ready before the prompt (Sequence::ready_steps); where a backend
// readies them (the GPU captures their graphs), the run log says how long that took, apart from the
// prompt's and the decode steps' times.
TEST_F(Generate, ReadiedStepsAreReportedApartFromThePromptAndTheSteps) {
  std::string text;
  engine::GenerateResult result = run(greedy(4), &text);
  EXPECT_EQ(result.ready_seconds, 0.0);
  EXPECT_EQ(engine::speed_report(result).find("readied"), std::string::npos) << engine::speed_report(result);
  result.ready_seconds = 0.0025;
  const std::string report = engine::speed_report(result);
  EXPECT_NE(report.find("; steps readied before the prompt in 2.5 ms"), std::string::npos) << report;
  EXPECT_NE(report.find("generated: "), std::string::npos) << report;
}

TEST_F(Generate, StopStringEndsTheTextBeforeIt) {
  std::string full;
  auto g = greedy(16);
  g.stop_at_end_of_generation = false;
  run(g, &full);
  ASSERT_GE(full.size(), 6u);
  const std::string stop = full.substr(full.size() / 2, 2);
  const size_t at = full.find(stop);
  g.stop_strings = {stop};
  std::string text;
  const auto result = run(g, &text);
  EXPECT_EQ(result.finish, engine::FinishReason::stop_string);
  EXPECT_EQ(text, full.substr(0, at));
}

TEST_F(Generate, EndOfTurnTokenStopsAndIsNotShown) {
  const int32_t im_end = *tokenizer_->find_token("<|im_end|>");
  auto g = greedy(16);
  g.sampling.logit_bias = {{im_end, 1000.0f}};
  std::string text;
  const auto result = run(g, &text);
  EXPECT_EQ(result.finish, engine::FinishReason::end_of_generation);
  EXPECT_EQ(result.tokens, std::vector<int32_t>{im_end});
  EXPECT_TRUE(result.last_token_pending);
  EXPECT_EQ(text, "");
}

// A stop string does not match inside an added token's text: "think" in </think> (forced first)
// neither stops generation nor cuts the markup; the same stop in the words after it still does.
TEST_F(Generate, StopStringsDoNotMatchInsideAddedTokens) {
  const int32_t end_think = *tokenizer_->find_token("</think>");
  auto g = greedy(6);
  g.stop_at_end_of_generation = false;
  g.stop_strings = {"think"};
  g.sampling.logit_bias = {{end_think, 1000.0f}};  // (every token is </think>)
  std::string text;
  const auto result = run(g, &text);
  EXPECT_EQ(result.finish, engine::FinishReason::length);
  EXPECT_EQ(text, "</think></think></think></think></think></think>");
}

TEST_F(Generate, AFullContextEndsGenerationAndATooLongPromptIsRefused) {
  const auto prompt = tokenizer_->encode("The weather today", false);
  cpu::Session s(*reader_, model::read_config(reader_->metadata()),
                 {.threads = 1, .max_context = int64_t(prompt.size()) + 5});
  auto g = greedy(20);
  g.stop_at_end_of_generation = false;
  sample::Sampler sampler(g.sampling, s.vocab());
  const auto r = engine::generate(*cpu::borrow_sequence(s), *tokenizer_, sampler, prompt, g, [](std::string_view) {});
  EXPECT_EQ(r.finish, engine::FinishReason::context_full);
  EXPECT_EQ(r.tokens.size(), 6u);  // 5 decoded into the context, the 6th sampled and pending
  EXPECT_EQ(s.position(), s.max_context());
  try {
    engine::generate(*cpu::borrow_sequence(s), *tokenizer_, sampler, prompt, g, [](std::string_view) {});
    FAIL() << "a prompt that does not fit was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only 0 of the context"), std::string::npos) << e.what();
  }
}

// Greedy generation with steering: engine::generate takes the engine's greedy token while the
// reply is not being steered (before the `after` token and once a choice is complete) and the
// masked logits while it is; the tokens equal a loop that samples every step from the logits.
TEST_F(Generate, SteeredGreedyEqualsTheLogitsLoop) {
  std::string plain_text;
  auto g = greedy(24);
  g.stop_at_end_of_generation = false;
  const auto plain = run(g, &plain_text);
  ASSERT_GE(plain.tokens.size(), 3u);
  g.steer = engine::SteeredText{.after = plain.tokens[2], .choices = {" banana split", " cherry"}};
  std::string text;
  const auto steered = run(g, &text);

  cpu::Session s = session();
  sample::Sampler sampler(g.sampling, s.vocab());
  const auto prompt = tokenizer_->encode("The weather today", false);
  for (int32_t t : prompt) sampler.accept(t);
  std::string loop_text;
  engine::Generation generation(*tokenizer_, sampler, g, [&](std::string_view piece) { loop_text += piece; },
                                int64_t(prompt.size()));
  const auto sequence = cpu::borrow_sequence(s);
  std::optional<int32_t> next = generation.step(engine::prefill(*sequence, prompt, g.chunk));
  while (next) next = generation.step(engine::decode(*sequence, *next));
  EXPECT_EQ(steered.tokens, generation.result().tokens);
  EXPECT_EQ(text, loop_text);
  const std::string after = tokenizer_->decode(std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + 3), false);
  ASSERT_EQ(text.compare(0, after.size(), after), 0) << text;
  const std::string rest = text.substr(after.size());
  EXPECT_TRUE(rest.rfind(" banana split", 0) == 0 || rest.rfind(" cherry", 0) == 0) << rest;
}

// A steered choice's added tokens (<tool_call>, <think>) come as their tokens, as the template's
// text is read, never spelled byte by byte, however the logits prefer the pieces; the text before
// one ends where it begins.
TEST_F(Generate, SteeringTakesAddedTokensWhole) {
  const std::optional<int32_t> think = tokenizer_->find_token("<think>");
  ASSERT_TRUE(think);
  const std::vector<int32_t> piece_ids = tokenizer_->encode("a<", false);  // "a" then "<"
  ASSERT_EQ(piece_ids.size(), 2u);
  auto g = greedy(8);
  g.stop_at_end_of_generation = false;
  g.steer = engine::SteeredText{.after = -1, .choices = {"a<think>b"}};
  sample::Sampler sampler(g.sampling, tokenizer_->size());
  engine::Generation generation(*tokenizer_, sampler, g, [](std::string_view) {}, 1);
  // Logits that favour "<" (then "a<"-like pieces) over the added token at every step.
  std::vector<float> logits(size_t(tokenizer_->size()), 0.0f);
  logits[size_t(piece_ids[1])] = 10.0f;
  if (const auto both = tokenizer_->find_token("a<")) logits[size_t(*both)] = 20.0f;  // (where the vocabulary has it)
  EXPECT_EQ(generation.step(logits), piece_ids[0]);  // "a": "a<" would cross into <think>
  EXPECT_EQ(generation.step(logits), *think);         // not "<" though its logit is the highest
  const std::vector<int32_t> b = tokenizer_->encode("b", false);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(generation.step(logits), b[0]);
}

TEST_F(Generate, SameSeedSameTokensOtherSeedOthers) {
  engine::GenerateOptions g;
  g.max_tokens = 16;
  g.stop_at_end_of_generation = false;
  g.sampling.temperature = 1.5f;
  g.sampling.top_k = 0;
  g.sampling.top_p = 1;
  g.sampling.seed = 5;
  std::string a, b, c;
  const auto ra = run(g, &a), rb = run(g, &b);
  g.sampling.seed = 6;
  const auto rc = run(g, &c);
  EXPECT_EQ(ra.tokens, rb.tokens);
  EXPECT_NE(ra.tokens, rc.tokens);
}

}  // namespace
