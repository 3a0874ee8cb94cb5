// The layers spread over several GPUs (cuda/pipeline.h, issue 20), run as several shares on one
// GPU (and across GPUs where there are several): the rows cross from share to share by the same
// peer copies, so a pipeline of two or three shares must give the one-GPU session's bits (prompts in chunks and token by token, decode
// steps, greedy tokens, verify windows and cuts, rows of several sequences, kept prefixes) with
// every expert in VRAM and with most in host RAM, and through the engine interface; the MTP drafter
// on the last share drafts the one-GPU drafts. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/fixtures.h"
#include "test_gguf_helpers.h"
#include "support/gpu.h"
#include "support/loaded_weights.h"
#include "support/mtp_fixtures.h"
#include "support/step_checks.h"
#include "support/synth_model.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/device.h"
#include "cuda/engine.h"
#include "cuda/nccl.h"
#include "cuda/pipeline.h"
#include "cuda/session.h"
#include "engine/engine.h"
#include "plan/gpu_split.h"

namespace {

using lode::cuda::CudaPipeline;
using lode::cuda::CudaSession;
using lode::cuda::CudaSessionOptions;
using lode::test::argmax;
using lode::test::same_bits;
using lode::test::synth_model;
using lode::test::tokens_from;

using Loaded = lode::test::LoadedWeights;

// Per share, and for the one session: every expert of the synths fits (so that both run the same
// products; where the experts live changes no bits either, but that is CudaRows' to show).
constexpr size_t kBudget = size_t(4) << 30;

// The same calls on one session and on a pipeline; every output must have the same bits.
// (The one session's budget: one_budget, else the options'.)
void compare(const Loaded& m, const CudaSessionOptions& options, const std::vector<int>& gpus, const std::string& what,
             lode::cuda::HandOverBy by = lode::cuda::HandOverBy::peer_copy, size_t one_budget = 0,
             int64_t* lent = nullptr) {
  SCOPED_TRACE(what);
  const int64_t vocab = m.config.vocab, hidden = m.config.hidden;
  CudaSessionOptions alone = options;
  if (one_budget) alone.vram_budget = one_budget;
  CudaSession one(m.reader, m.weights, alone);
  CudaPipeline many(m.reader, m.weights, options, gpus, by);
  if (lent) *lent = many.lent_experts();
  ASSERT_EQ(many.shares(), gpus.size());
  if (options.max_resident_experts < 0) {
    ASSERT_TRUE(one.plan().all_resident());
    EXPECT_TRUE(many.plan().all_resident());
  }
  EXPECT_EQ(many.prompt_chunk(), one.prompt_chunk());
  for (size_t g = 1; g < many.shares(); ++g) EXPECT_EQ(many.first_layer(g), many.end_layer(g - 1));
  EXPECT_EQ(many.end_layer(many.shares() - 1), m.config.n_layers);
  const auto same = [&](const std::vector<float>& a, const std::vector<float>& b, const char* where) {
    ASSERT_EQ(a.size(), b.size()) << where;
    EXPECT_TRUE(same_bits(a.data(), b.data(), a.size())) << where;
  };
  // A prompt of several chunks and a partial one, every position's logits and hidden states.
  const std::vector<int32_t> prompt = tokens_from(vocab, 2 * int(options.prompt_chunk) + 5, 1);
  std::vector<float> hidden_one, hidden_many;
  same(one.prefill(prompt, true, &hidden_one), many.prefill(prompt, true, &hidden_many), "prompt logits");
  same(hidden_one, hidden_many, "prompt hidden states");
  // Decode steps, a greedy token, a verify window cut short.
  for (int32_t t : tokens_from(vocab, 3, 2)) same(one.decode(t), many.prefill(std::span(&t, 1)), "a decode step");
  const int32_t token = tokens_from(vocab, 1, 3)[0];
  EXPECT_EQ(one.decode_greedy(token), many.decode_greedy(token));
  const std::vector<int32_t> window = tokens_from(vocab, 3, 4);
  const CudaSession::Window w1 = one.decode_window(window, false, true), wm = many.decode_window(window, false, true);
  same(w1.logits, wm.logits, "a window's logits");
  same(w1.hidden, wm.hidden, "a window's hidden states");
  one.cut_window(1), many.cut_window(1);
  EXPECT_EQ(one.position(), many.position());
  // A kept prefix, gone past and resumed.
  const auto kept_one = one.keep();
  const auto kept_many = many.keep();
  EXPECT_EQ(kept_many->positions(), one.position());
  one.decode(token), many.decode_greedy(token);
  one.resume(*kept_one), many.resume(*kept_many);
  same(one.decode(token), many.prefill(std::span(&token, 1)), "a step after resuming");
  // Rows of the three sequences, at different positions.
  for (int64_t s = 1; s < 3; ++s) {
    const std::vector<int32_t> p = tokens_from(vocab, int(3 + 5 * s), int(10 + s));
    one.use_sequence(s), many.use_sequence(s);
    same(one.prefill(p), many.prefill(p), "another sequence's prompt");
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<CudaSession::Row> rows;
    for (int64_t s : {2, 0, 1}) rows.push_back({s, tokens_from(vocab, 1, 20 + step * 3 + int(s))[0]});
    const CudaSession::Window r1 = one.decode_rows(rows, step == 1, true);
    const CudaSession::Window rm = many.decode_rows(rows, step == 1, true);
    same(r1.logits, rm.logits, "rows' logits");
    EXPECT_EQ(r1.greedy, rm.greedy);
    same(r1.hidden, rm.hidden, "rows' hidden states");
  }
  EXPECT_EQ(many.kv_bytes(), one.kv_bytes());
  (void)hidden;
}

TEST(CudaPipeline, SharesOnOneGpuGiveTheOneGpuBits) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "tiny.gguf", "tiny", "ud-q4_k_xl", 41, 8);
  synth_model(dir / "big.gguf", "qwen3.6-35b-a3b", "ud-q4_k_xl", 42, 4);
  const CudaSessionOptions options{.max_context = 256, .step_rows = 3, .window_rows = 3, .sequences = 3,
                                   .vram_budget = kBudget, .prompt_chunk = 16};
  for (const char* name : {"tiny.gguf", "big.gguf"}) {
    const Loaded m(dir / name);
    compare(m, options, {0, 0}, std::string(name) + ", two shares");
    compare(m, options, {0, 0, 0}, std::string(name) + ", three shares");
    CudaSessionOptions few = options;  // most experts in host RAM, read over PCIe or by the CPU
    few.max_resident_experts = m.config.n_experts;
    compare(m, few, {0, 0}, std::string(name) + ", two shares, experts in host RAM");
    CudaSessionOptions token_by_token = options;
    token_by_token.prompt_chunk = 0;
    compare(m, token_by_token, {0, 0}, std::string(name) + ", two shares, prompts token by token");
    std::string why;
    if (lode::cuda::list_devices(&why).size() >= 2) {  // (on a machine with several GPUs: across them)
      compare(m, options, {0, 1}, std::string(name) + ", GPUs 0 and 1");
      compare(m, few, {1, 0}, std::string(name) + ", GPUs 1 and 0, experts in host RAM");
      compare(m, options, {0, 1}, std::string(name) + ", GPUs 0 and 1 through NCCL", lode::cuda::HandOverBy::nccl);
    }
  }
}

// A split whose first GPU is short of room for its layers' experts, wanted most, while the second
// has room to spare: the second holds some of them (GpuSplit's lending), and the first reads them
// there in place. The bits are one session's, where every expert is in VRAM.
TEST(CudaPipeline, ExpertsHeldForAnotherShareAreReadInPlace) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "tiny.gguf", "tiny", "ud-q4_k_xl", 45, 8);
  const Loaded m(dir / "tiny.gguf");
  CudaSessionOptions options{.max_context = 256, .step_rows = 3, .window_rows = 3, .sequences = 3,
                             .prompt_chunk = 16};
  const std::vector<size_t> roomy(2, kBudget);
  const lode::plan::PlanOptions po = lode::cuda::plan_options(options, 0);
  const lode::plan::GpuSplit wide = lode::plan::split_over_gpus(*m.weights, po, roomy);
  // A budget with room for 40% of all experts on each GPU, whose first GPU's layers hold half.
  const int64_t total = wide.experts_total;
  const size_t fixed = std::max(wide.gpus[0].fixed(), wide.gpus[1].fixed());
  const size_t budget = fixed + size_t(total * 4 / 10) * wide.slot_bytes;
  const lode::plan::GpuSplit cut = lode::plan::split_over_gpus(*m.weights, po, std::vector<size_t>(2, budget));
  options.vram_budget = budget;
  options.max_resident_experts = total;  // (no cap; it only tells compare() that not all of them fit)
  options.expert_scores.assign(size_t(total), 1.0);
  for (int64_t i = 0; i < cut.gpus[0].end_layer * m.config.n_experts; ++i) options.expert_scores[size_t(i)] = 2.0;
  int64_t lent = 0;
  compare(m, options, {0, 0}, "two shares, the second holding some of the first's experts",
          lode::cuda::HandOverBy::peer_copy, kBudget, &lent);
  EXPECT_GT(lent, 0);
}

// The engine on a pipeline: steps of several sequences' rows and a prompt, checkpoints and
// rewinds, as on one GPU.
TEST(CudaPipeline, ThroughTheEngine) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 43, 8);
  const Loaded m(dir / "m.gguf");
  const int64_t vocab = m.config.vocab;
  const CudaSessionOptions options{.max_context = 128, .step_rows = 2, .sequences = 2, .vram_budget = kBudget,
                                   .prompt_chunk = 16};
  const auto run = [&](std::shared_ptr<lode::cuda::CudaModel> model) {
    auto a = model->open_sequence(), b = model->open_sequence();
    std::vector<std::vector<float>> out;
    out.push_back(lode::engine::prefill(*a, tokens_from(vocab, 40, 1), 0));
    const auto checkpoint = a->checkpoint();
    const int32_t x = tokens_from(vocab, 1, 2)[0], y = tokens_from(vocab, 1, 3)[0];
    const std::vector<int32_t> prompt = tokens_from(vocab, 21, 4);
    std::vector<lode::engine::StepRow> rows = {{.sequence = b.get(), .tokens = prompt},
                                               {.sequence = a.get(), .tokens = std::span(&x, 1)}};
    model->step(rows);
    out.push_back(rows[0].logits), out.push_back(rows[1].logits);
    a->rewind(*checkpoint);
    std::vector<lode::engine::StepRow> again = {{.sequence = a.get(), .tokens = std::span(&y, 1)},
                                                {.sequence = b.get(), .tokens = std::span(&x, 1)}};
    model->step(again);
    out.push_back(again[0].logits), out.push_back(again[1].logits);
    b->copy_prefix(*a, *checkpoint);
    EXPECT_EQ(b->position(), 40);
    return out;
  };
  const auto one = run(std::make_shared<lode::cuda::CudaModel>(std::make_unique<CudaSession>(m.reader, m.weights, options)));
  const auto many = run(std::make_shared<lode::cuda::CudaModel>(
      std::make_unique<CudaPipeline>(m.reader, m.weights, options, std::vector<int>{0, 0})));
  ASSERT_EQ(one.size(), many.size());
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(one[i].size(), size_t(vocab)) << i;
    ASSERT_EQ(many[i].size(), size_t(vocab)) << i;
    EXPECT_TRUE(same_bits(one[i].data(), many[i].data(), size_t(vocab))) << "output " << i;
  }
}

// Refused clearly: a GPU that is not there, a budget that cannot hold a share.
TEST(CudaPipeline, RefusesWhatItCannotDo) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "q8_0", 44, 8);
  const Loaded m(dir / "m.gguf");
  const auto refused = [&](const CudaSessionOptions& o, const std::vector<int>& gpus, const char* why) {
    try {
      CudaPipeline p(m.reader, m.weights, o, gpus);
      ADD_FAILURE() << "not refused: " << why;
    } catch (const lode::Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  const CudaSessionOptions options{.max_context = 128, .vram_budget = kBudget};
  refused(options, {0, 99}, "there is no GPU 99");
  refused(options, {}, "name at least one GPU");
  CudaSessionOptions tight = options;
  tight.vram_budget = size_t(1) << 20;
  refused(tight, {0, 0}, "short by");
}

// The MTP drafter on the last of two shares (beside the lm head and the last layer's hidden states)
// drafts what it drafts on one GPU: lode-mini with --mtp 2, greedy and sampled, gives the tokens,
// the drafts and the accepted drafts of one session, and the output of one session without drafts.
TEST(CudaPipeline, DraftsOverTwoSharesAreThoseOfOneGpu) {
  LODE_REQUIRE_GPU();
  const lode::test::LoadedFile& m = lode::test::mini();
  CudaSessionOptions options{.max_context = 512, .vram_budget = kBudget};
  options.step_rows = 3, options.window_rows = 3;
  const auto generated = [&](std::unique_ptr<CudaPipeline> pipeline, int64_t mtp, float temperature) {
    const auto model = std::make_shared<lode::cuda::CudaModel>(std::move(pipeline));
    const auto sequence = model->open_sequence();
    return lode::test::generate_on(*sequence, m, "The shell reads a line of text and", mtp, temperature, 3, 40);
  };
  CudaSessionOptions plain = options;
  plain.step_rows = 1, plain.window_rows = 1;
  CudaSessionOptions drafting = options;
  drafting.mtp = true;
  for (const float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE(testing::Message() << "temperature " << temperature);
    const auto without = generated(std::make_unique<CudaPipeline>(m.reader, m.weights, plain, std::vector<int>{0}), 0,
                                   temperature);
    const auto one = generated(std::make_unique<CudaPipeline>(m.reader, m.weights, drafting, std::vector<int>{0}), 2,
                               temperature);
    auto two_shares = std::make_unique<CudaPipeline>(m.reader, m.weights, drafting, std::vector<int>{0, 0});
    ASSERT_EQ(two_shares->shares(), size_t(2));
    EXPECT_FALSE(two_shares->share(0).has_mtp());
    EXPECT_TRUE(two_shares->share(1).has_mtp());
    const auto two = generated(std::move(two_shares), 2, temperature);
    EXPECT_EQ(one.tokens, without.tokens);
    EXPECT_EQ(two.tokens, one.tokens);
    EXPECT_EQ(two.result.drafted, one.result.drafted);
    EXPECT_EQ(two.result.accepted, one.result.accepted);
    EXPECT_EQ(two.result.windows, one.result.windows);
    EXPECT_GT(two.result.accepted, 0) << "a trained block's drafts are sometimes right";
  }
}

// NCCL takes one rank a GPU (refused before it is loaded); on the GPU machine it loads and makes a
// communicator, or the test says why it cannot.
TEST(CudaPipeline, NcclTakesOneRankAGpu) {
  try {
    lode::cuda::NcclGroup twice({0, 0});
    ADD_FAILURE() << "a GPU named twice was not refused";
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("named twice"), std::string::npos) << e.what();
  }
  LODE_REQUIRE_GPU();
  try {
    const lode::cuda::NcclGroup one({0});
    EXPECT_FALSE(one.version().empty());
  } catch (const lode::Error& e) {
    if (std::string(e.what()).find("cannot load libnccl.so.2") == std::string::npos) throw;
    GTEST_SKIP() << e.what();
  }
}

}  // namespace

#else
TEST(CudaPipeline, NeedsACudaBuild) { LODE_REQUIRE_GPU(); }
#endif
