// Speculative decoding on the GPU (issue 19): the MTP block's drafter on the GPU (cuda/mtp_drafter.h)
// and verify windows that the sequence cuts instead of rewinding (CudaSession::cut_window):
// - greedy output with drafts is the output without, token for token, on lode-mini (a trained
//   block) in every K/V format, on a tiny synth (a random block that drafts badly) with a third of
//   its experts in VRAM, and sampled output with the same seed;
// - the GPU's block is right: lode-mini's drafts agree with the model's next greedy token about as
//   often as training measured (docs/MINI.md: 56.7%), as the CPU's do (tests/test_mtp.cpp);
// - a file without the block is refused, saying so.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "gguf/reader.h"
#include "model/synth.h"
#include "model/weights.h"
#include "sample/sampler.h"
#include "support/fixtures.h"
#include "support/gpu.h"
#include "support/mtp_fixtures.h"
#include "support/paths.h"
#include "support/run_lode.h"
#include "test_gguf_helpers.h"
#include "tokenizer/tokenizer.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/engine.h"
#include "cuda/mtp_drafter.h"
#include "cuda/session.h"

namespace {

using namespace lode;

using Loaded = test::LoadedFile;
using test::mini;

// A GPU model of one sequence; with mtp > 0 it holds the MTP block and windows of mtp + 1.
std::shared_ptr<cuda::CudaModel> gpu_model(const Loaded& m, int64_t mtp, cuda::CudaSessionOptions options = {}) {
  options.mtp = mtp > 0;
  options.step_rows = mtp + 1;
  return std::make_shared<cuda::CudaModel>(std::make_unique<cuda::CudaSession>(m.reader, m.weights, options));
}

using test::Generated;

Generated generate(const Loaded& m, const std::string& prompt, int64_t mtp, cuda::CudaSessionOptions options,
                   float temperature, uint64_t seed, int64_t max_tokens = 48) {
  const auto model = gpu_model(m, mtp, options);
  const auto sequence = model->open_sequence();
  return test::generate_on(*sequence, m, prompt, mtp, temperature, seed, max_tokens);
}

TEST(CudaMtp, GreedyOutputIsTheSameWithDraftsInEveryKvFormat) {
  LODE_REQUIRE_GPU();
  const std::string prompt = "The shell reads a line of text and";
  for (kv::Format format : kv::all_formats()) {
    SCOPED_TRACE(kv::to_string(format));
    const Generated plain = generate(mini(), prompt, 0, {.kv_format = format}, 0.0f, 1);
    for (int64_t n : {1, 3}) {
      const Generated drafted = generate(mini(), prompt, n, {.kv_format = format}, 0.0f, 1);
      EXPECT_EQ(drafted.tokens, plain.tokens) << "--mtp " << n;
      EXPECT_EQ(drafted.text, plain.text) << "--mtp " << n;
      EXPECT_GT(drafted.result.accepted, 0) << "a trained block's drafts are sometimes right";
      EXPECT_LT(drafted.result.windows, int64_t(plain.tokens.size()) - 1) << "fewer steps than tokens";
      std::printf("[ cuda ] %s, --mtp %lld: %lld of %lld drafts accepted, %lld windows for %zu tokens\n",
                  kv::to_string(format), static_cast<long long>(n), static_cast<long long>(drafted.result.accepted),
                  static_cast<long long>(drafted.result.drafted), static_cast<long long>(drafted.result.windows),
                  drafted.tokens.size());
    }
  }
}

// --mtp-min-p: drafting stops where the block's best token is less likely than that (its
// probability from the logits the GPU copies back); at 1 nothing is drafted, at 0.5 only some.
TEST(CudaMtp, TheMinimumProbabilityStopsDrafting) {
  LODE_REQUIRE_GPU();
  const std::string prompt = "The shell reads a line of text and";
  const Generated plain = generate(mini(), prompt, 0, {}, 0.0f, 1);
  int64_t drafted[2] = {};
  for (int i = 0; i < 2; ++i) {
    const auto m = gpu_model(mini(), 3);
    const auto sequence = m->open_sequence();
    const Generated r = test::generate_on(*sequence, mini(), prompt, 3, 0.0f, 1, 48, i == 0 ? 1.0f : 0.5f);
    EXPECT_EQ(r.tokens, plain.tokens);
    drafted[i] = r.result.drafted;
  }
  EXPECT_EQ(drafted[0], 0);
  const Generated all = generate(mini(), prompt, 3, {}, 0.0f, 1);
  EXPECT_GT(drafted[1], 0);
  EXPECT_LT(drafted[1], all.result.drafted);
}

TEST(CudaMtp, SampledOutputIsTheSameWithDraftsForEverySeed) {
  LODE_REQUIRE_GPU();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    const Generated plain = generate(mini(), "Files and directories", 0, {}, 0.9f, seed, 24);
    const Generated drafted = generate(mini(), "Files and directories", 4, {}, 0.9f, seed, 24);
    EXPECT_EQ(drafted.tokens, plain.tokens);
  }
}

// A random block drafts badly (windows cut back nearly every time), and a third of the experts in
// VRAM reads the rest over PCIe: still the output of the plain run with every expert in VRAM.
TEST(CudaMtp, ARandomBlockAndExpertsInHostRamChangeNothing) {
  LODE_REQUIRE_GPU();
  const test::TempDir dir;
  model::SynthOptions o;
  o.layers = 4;
  o.mtp = true;
  o.seed = 3;
  o.recipe = "ud-q4_k_xl";
  model::write_synth(dir / "tiny.gguf", o);
  const Loaded tiny(dir / "tiny.gguf");
  const int64_t third = tiny.config.n_layers * tiny.config.n_experts / 3;
  const Generated plain = generate(tiny, "a b c", 0, {}, 0.0f, 1, 32);
  const Generated drafted = generate(tiny, "a b c", 2, {.max_resident_experts = third}, 0.0f, 1, 32);
  EXPECT_EQ(drafted.tokens, plain.tokens);
  EXPECT_GT(drafted.result.drafted, 0);
}

// Teacher-forced on lode-mini's held-out sample, as tests/test_mtp.cpp does on the CPU: the GPU
// block's drafts agree with the model's next greedy token about as often as training measured.
TEST(CudaMtp, TheBlocksDraftsAgreeWithTheModelAsInTraining) {
  LODE_REQUIRE_GPU();
  const auto model = gpu_model(mini(), 1, {.max_context = 1024});
  const auto sequence = model->open_sequence();
  const double share = test::held_out_agreement(*sequence);
  EXPECT_GT(share, 0.45);
  EXPECT_LT(share, 0.75);
}

// Each of a session's sequences has its own K/V cache of the block: drafters of two sequences,
// following and drafting in turn, draft as drafters alone on sessions of one sequence do.
TEST(CudaMtp, DraftersOfTwoSequencesKeepTheirOwnRows) {
  LODE_REQUIRE_GPU();
  const Loaded& m = mini();
  cuda::CudaSession two(m.reader, m.weights, {.max_context = 256, .step_rows = 2, .sequences = 2, .mtp = true});
  const std::vector<int32_t> a = m.text.encode("The ls command lists the files of a folder, and with -l", false),
                             b = m.text.encode("To copy a file keep its name: cp notes.txt backup/ then", false);
  std::vector<float> hidden_a, hidden_b;
  two.use_sequence(0);
  two.prefill(a, false, &hidden_a);
  cuda::GpuDrafter first(two);
  first.advance(a, hidden_a);
  two.use_sequence(1);
  two.prefill(b, false, &hidden_b);
  cuda::GpuDrafter second(two);
  second.advance(b, hidden_b);  // (its own cache: the first's rows stay)
  const int32_t p = a.front(), q = b.front();
  // Drafts of both, in turn, with the session working on the other sequence meanwhile.
  const std::vector<int32_t> second_drafts = second.draft(q, 4, 0);
  two.use_sequence(0);
  const std::vector<int32_t> first_drafts = first.draft(p, 4, 0), second_again = second.draft(q, 4, 0);
  ASSERT_EQ(first_drafts.size(), 4u);
  EXPECT_EQ(first.followed(), int64_t(a.size()));
  // The reference: a drafter that followed the whole text, on a session of one sequence.
  const auto drafts_of = [&](std::span<const int32_t> tokens, std::span<const float> hidden, int32_t pending) {
    cuda::CudaSession one(m.reader, m.weights, {.max_context = 256, .step_rows = 2, .mtp = true});
    cuda::GpuDrafter drafter(one);
    drafter.advance(tokens, hidden);
    return drafter.draft(pending, 4, 0);
  };
  const std::vector<int32_t> reference_a = drafts_of(a, hidden_a, p), reference_b = drafts_of(b, hidden_b, q);
  EXPECT_EQ(second_drafts, reference_b);
  EXPECT_EQ(first_drafts, reference_a) << "the second's rows written after the first's";
  EXPECT_EQ(second_again, reference_b) << "the first's drafts written after the second's";
  // The test can fail: from no rows but the last token's, the drafts differ (as they did when the
  // sequences shared one cache and wrote over each other's rows).
  cuda::CudaSession one(m.reader, m.weights, {.max_context = 256, .step_rows = 2, .mtp = true});
  cuda::GpuDrafter late(one);
  late.reset(int64_t(a.size()) - 1);
  late.advance(std::span(a).last(1), std::span(hidden_a).last(size_t(m.config.hidden)));
  EXPECT_NE(late.draft(p, 4, 0), reference_a) << "the drafts do not depend on the rows followed";
}

// Drafts for several sequences in one step of the block a draft (GpuDrafter::draft_together, the
// GPU server's) are each drafter's own drafts: different numbers wanted (none for one), a minimum
// probability for another, one drafter that has followed nothing (no drafts), one begun part way
// (its rows' rotary positions shifted otherwise than the others').
TEST(CudaMtp, DraftersOfSeveralSequencesDraftTogetherAsAlone) {
  LODE_REQUIRE_GPU();
  const Loaded& m = mini();
  cuda::CudaSession session(m.reader, m.weights, {.max_context = 256, .step_rows = 5, .sequences = 5, .mtp = true});
  const char* texts[] = {"The ls command lists the files of a folder, and with -l", "To copy a file keep its name: cp",
                         "grep finds lines that match a pattern in", "A folder's disk usage: du -sh"};
  std::vector<std::unique_ptr<cuda::GpuDrafter>> drafters;
  std::vector<int32_t> pending;
  for (int64_t q = 0; q < 4; ++q) {
    const std::vector<int32_t> tokens = m.text.encode(texts[q], false);
    std::vector<float> hidden;
    session.use_sequence(q);
    session.prefill(tokens, false, &hidden);
    drafters.push_back(std::make_unique<cuda::GpuDrafter>(session));
    if (q == 1) {  // begun 5 tokens back: its K/V row 0 is position 5 from the end
      const size_t from = tokens.size() - 5;
      drafters.back()->reset(int64_t(from));
      drafters.back()->advance(std::span(tokens).subspan(from),
                               std::span(hidden).subspan(from * size_t(m.config.hidden)));
    } else {
      drafters.back()->advance(tokens, hidden);
    }
    pending.push_back(tokens[size_t(q)]);
  }
  session.use_sequence(4);
  drafters.push_back(std::make_unique<cuda::GpuDrafter>(session));  // (nothing followed)
  pending.push_back(pending.front());
  const std::vector<int64_t> n = {4, 2, 0, 3, 2};
  const std::vector<float> min_p = {0, 0, 0, 0.5f, 0};
  std::vector<cuda::GpuDrafter*> all;
  for (auto& d : drafters) all.push_back(d.get());
  // (What the engine asks: engine::DraftAsk's, drafters[i] asks[i]'s.)
  const auto draft_together = [](std::vector<cuda::GpuDrafter*> drafters, std::span<const int32_t> tokens,
                                 std::span<const int64_t> wanted, std::span<const float> least) {
    std::vector<engine::DraftAsk> asks;
    for (size_t i = 0; i < drafters.size(); ++i) asks.push_back({drafters[i], tokens[i], wanted[i], least[i]});
    return cuda::GpuDrafter::draft_together(drafters, asks);
  };
  test::expect_drafts_as_alone(draft_together(all, pending, n, min_p), all, pending, n, min_p);
  // And again, the drafters having followed another token each (their rows written after the drafts').
  for (size_t i = 0; i < 4; ++i) {
    session.use_sequence(int64_t(i));
    std::vector<float> hidden;
    session.prefill(std::span(&pending[i], 1), false, &hidden);
    all[i]->advance(std::span(&pending[i], 1), hidden);
  }
  const std::vector<int64_t> three(5, 3);
  const std::vector<std::vector<int32_t>> again =
      draft_together(all, pending, three, std::vector<float>(5, 0.0f));
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(again[i], all[i]->draft(pending[i], 3, 0)) << "drafter " << i << ", again";
  // Three other sequences than the first call's three (its captured step replayed for them).
  const std::vector<cuda::GpuDrafter*> others = {all[1], all[2], all[3]};
  const std::vector<std::vector<int32_t>> third = draft_together(
      others, std::span(pending).subspan(1, 3), std::span(three).first(3), std::vector<float>(3, 0.0f));
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(third[i], others[i]->draft(pending[i + 1], 3, 0)) << "drafter " << i + 1 << ", with others";
}

// Greedy verify windows of a drafter's own drafts on a session, accepted as generation accepts
// them (each draft kept while it equals the greedy token before it; the window cut there): each
// window's drafts and greedy tokens, and the drafter. With `arm`, each window arms the drafts after
// it in its step (GpuDrafter::arming), shifted `off` K/V rows from where the drafter asks.
struct ArmedRun {
  std::vector<std::vector<int32_t>> drafts, greedy;
  int64_t cuts = 0, armed_drafts = 0, continued_drafts = 0;
};
ArmedRun verify_windows(const Loaded& m, int64_t n, int64_t windows, bool arm, int64_t off = 0) {
  cuda::CudaSession session(m.reader, m.weights, {.max_context = 512, .step_rows = n + 1, .mtp = true});
  cuda::GpuDrafter drafter(session);
  const std::vector<int32_t> prompt = m.text.encode("The ls command lists the files of a folder, and with -l", false);
  std::vector<float> hidden;
  int32_t pending = sample::greedy(session.prefill(prompt, false, &hidden));
  drafter.advance(prompt, hidden);
  ArmedRun run;
  const size_t width = size_t(m.config.hidden);
  for (int64_t w = 0; w < windows; ++w) {
    std::vector<int32_t> window = {pending};
    const std::vector<int32_t> drafts = drafter.draft(pending, n, 0);
    window.insert(window.end(), drafts.begin(), drafts.end());
    std::optional<cuda::CudaSession::WindowDrafts> armed = arm ? drafter.arming(window) : std::nullopt;
    if (armed) armed->first_row += off;
    const cuda::CudaSession::Window out = session.decode_window(window, true, true, armed ? &*armed : nullptr);
    if (armed) drafter.armed(out.greedy, out.drafts, out.continued);
    size_t kept = 1;
    while (kept < window.size() && window[kept] == out.greedy[kept - 1]) ++kept;
    if (kept < window.size()) session.cut_window(int64_t(kept)), ++run.cuts;
    drafter.advance(std::span(window).first(kept), std::span(out.hidden).first(kept * width));
    pending = out.greedy[kept - 1];
    run.drafts.push_back(drafts), run.greedy.push_back(out.greedy);
  }
  run.armed_drafts = drafter.armed_drafts(), run.continued_drafts = drafter.continued_drafts();
  return run;
}

// Drafts armed in the verify step (CudaSession::WindowDrafts): the block run over the window's rows
// in its step gives the drafts that steps of the block after it give, window after window, kept
// whole or cut, one draft or three; it saves the draft step of each window's first draft, and with
// three, continues to the second (from the row of the last token kept, found on the device). Shifted
// by a K/V row, the armed rows give other drafts: the test can fail.
TEST(CudaMtp, DraftsArmedInTheVerifyStepAreTheDraftsOfStepsOfTheirOwn) {
  LODE_REQUIRE_GPU();
  for (int64_t n : {1, 3}) {
    SCOPED_TRACE(n);
    const ArmedRun plain = verify_windows(mini(), n, 40, false), armed = verify_windows(mini(), n, 40, true);
    EXPECT_EQ(armed.drafts, plain.drafts);
    EXPECT_EQ(armed.greedy, plain.greedy);
    EXPECT_GT(plain.cuts, 0) << "some windows are cut";
    EXPECT_LT(plain.cuts, 40) << "some windows are kept whole";
    EXPECT_EQ(plain.armed_drafts, 0);
    EXPECT_EQ(armed.armed_drafts, 39) << "every window's first draft but the first window's from the step before";
    EXPECT_EQ(armed.continued_drafts, n > 1 ? 39 : 0) << "and with several drafts, the second too";
    if (n == 3) EXPECT_NE(verify_windows(mini(), n, 40, true, 1).drafts, plain.drafts) << "rows one off";
  }
}

// Through the engine, greedy windows arm their drafts (lode run's and a lone server sequence's path).
TEST(CudaMtp, GreedyGenerationArmsItsDraftsInTheVerifySteps) {
  LODE_REQUIRE_GPU();
  const auto model = gpu_model(mini(), 2);
  const auto sequence = model->open_sequence();
  const Generated r = test::generate_on(*sequence, mini(), "The shell reads a line of text and", 2, 0.0f, 1, 64);
  const auto& drafter = dynamic_cast<const cuda::GpuDrafter&>(sequence->drafter());
  EXPECT_GT(r.result.windows, 10);
  // Every window's first draft but the first window's, and the last's where its token limit leaves
  // it none.
  EXPECT_GE(drafter.armed_drafts(), r.result.windows - 2);
  EXPECT_LT(drafter.armed_drafts(), r.result.windows);
  EXPECT_GT(drafter.continued_drafts(), 0) << "--mtp 2: the second draft from the verify step where its first was kept";
}

// engine::generate readies its decode steps before the prompt (Sequence::ready_steps, as
// engine::ready_decode_steps asks for them): once readied, a generation captures no graph of its
// own, with drafts greedy (windows, cuts, armed and continued drafts, the block's rows) or sampled
// (windows of logits, draft steps), and without them sampled from the top candidates. Steps the
// readying missed would be captured as they first run, and counted.
TEST(CudaMtp, ReadiedStepsAreAllTheGraphsAGenerationCaptures) {
  LODE_REQUIRE_GPU();
  struct Case {
    int64_t mtp;
    float temperature;
  };
  for (const Case c : {Case{2, 0.0f}, Case{3, 0.9f}, Case{0, 0.7f}, Case{0, 0.0f}}) {
    SCOPED_TRACE(testing::Message() << "--mtp " << c.mtp << " --temp " << c.temperature);
    const auto model = gpu_model(mini(), c.mtp);
    const cuda::CudaSession& session = model->pipeline().share(0);
    const auto sequence = model->open_sequence();
    engine::GenerateOptions g;
    g.mtp = c.mtp;
    g.sampling.temperature = c.temperature;
    const sample::Sampler sampler(g.sampling, mini().config.vocab);
    EXPECT_GT(engine::ready_decode_steps(*sequence, sampler, g), 0.0);
    const int64_t readied = session.graphs_captured();
    EXPECT_GT(readied, 0);
    const Generated r = test::generate_on(*sequence, mini(), "The shell reads", c.mtp, c.temperature, 3, 40);
    EXPECT_EQ(r.tokens.size(), 40u);
    EXPECT_GT(r.result.ready_seconds, 0.0);
    EXPECT_EQ(session.graphs_captured(), readied) << "graphs captured while generating";
  }
}

TEST(CudaMtp, AFileWithoutTheBlockIsRefusedSayingSo) {
  LODE_REQUIRE_GPU();
  const test::TempDir dir;
  model::SynthOptions o;
  o.layers = 2;
  model::write_synth(dir / "plain.gguf", o);
  const auto r = test::run_lode("run -m '" + (dir / "plain.gguf").string() + "' -p 'a b' -n 4 --backend cuda --mtp 2",
                                dir.path());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("no MTP block"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("blk.2.nextn"), std::string::npos) << r.err;
}

}  // namespace

#else
TEST(CudaMtp, NeedsACudaBuild) { LODE_REQUIRE_GPU(); }
#endif
