// Verify windows on the GPU (issue 19's multi-row step, issue 18's rows of one sequence): T tokens
// at consecutive positions in one step give every row the bits that T one-token decode steps give
// (logits, greedy tokens, final-normed hidden states), and leave the same state behind, on the
// quantized synth models (Q8_0, Q4_K, Q5_K, Q6_K; the 35B geometry with few layers), lode-mini, in
// each K/V format, and with a third of the experts in VRAM (the window's absent experts computed by
// the CPU miss path or read over PCIe; the one-token steps beside it have every expert resident).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <tuple>

#include "core/error.h"
#include "gguf/reader.h"
#include "model/synth.h"
#include "model/weights.h"
#include "support/fixtures.h"
#include "support/gpu.h"
#include "support/loaded_weights.h"
#include "support/paths.h"
#include "support/step_checks.h"
#include "support/synth_model.h"
#include "test_gguf_helpers.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/engine.h"
#include "cuda/session.h"

namespace {

namespace fs = std::filesystem;
using lode::cuda::CudaSession;
using lode::cuda::CudaSessionOptions;

using lode::test::argmax;
using lode::test::same_bits;
using lode::test::synth_model;
using lode::test::tokens_from;

// `windowed` runs windows of the sizes in `sizes` after a prompt; `stepwise` (same model, its own
// options) runs the same tokens one decode step at a time. Every row must match bit for bit. With
// `stats`, what the windowed session's expert tier did.
void compare_windows(const fs::path& model, CudaSessionOptions windowed, CudaSessionOptions stepwise,
                     const std::vector<int>& sizes, const std::string& what,
                     lode::cuda::ExpertStats* stats = nullptr) {
  SCOPED_TRACE(what);
  const lode::test::LoadedWeights loaded(model);
  const auto& [reader, config, weights] = loaded;
  CudaSession a(reader, weights, windowed), b(reader, weights, stepwise);
  const int64_t vocab = config.vocab, hidden = config.hidden;
  const std::vector<int32_t> prompt = tokens_from(vocab, 21, 1);
  a.prefill(prompt);
  b.prefill(prompt);
  int seed = 2;
  for (int size : sizes) {
    SCOPED_TRACE("a window of " + std::to_string(size) + " at position " + std::to_string(a.position()));
    const std::vector<int32_t> tokens = tokens_from(vocab, size, seed++);
    const bool greedy = seed % 3 == 0;  // some windows take the greedy tokens, the rest the logits
    const CudaSession::Window w = a.decode_window(tokens, greedy, true);
    for (int t = 0; t < size; ++t) {
      const CudaSession::Window one = b.decode_window(std::span(&tokens[size_t(t)], 1), false, true);
      ASSERT_TRUE(same_bits(w.hidden.data() + t * hidden, one.hidden.data(), size_t(hidden))) << "row " << t;
      if (greedy)
        ASSERT_EQ(w.greedy[size_t(t)], argmax(one.logits.data(), vocab)) << "row " << t;
      else
        ASSERT_TRUE(same_bits(w.logits.data() + t * vocab, one.logits.data(), size_t(vocab))) << "row " << t;
    }
    ASSERT_EQ(a.position(), b.position());
  }
  // The states left behind: the next one-token step is the same in both.
  const std::vector<int32_t> next = tokens_from(vocab, 1, 99);
  const std::vector<float> la = a.decode(next[0]), lb = b.decode(next[0]);
  EXPECT_TRUE(same_bits(la.data(), lb.data(), size_t(vocab)));
  if (stats) *stats = a.expert_stats();
}

const std::vector<int> kSizes = {2, 1, 3, 4, 2, 4, 3};

TEST(CudaWindow, RowsGetTheBitsOfOneTokenStepsOnQuantizedSynths) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "k.gguf", "tiny", "ud-q4_k_xl", 5);
  synth_model(dir / "q8.gguf", "tiny", "q8_0", 6);
  synth_model(dir / "big.gguf", "qwen3.6-35b-a3b", "ud-q4_k_xl", 7, 4);
  for (const char* name : {"k.gguf", "q8.gguf", "big.gguf"})
    compare_windows(dir / name, {.max_context = 256, .step_rows = 4}, {.max_context = 256}, kSizes, name);
}

TEST(CudaWindow, RowsGetTheBitsOfOneTokenStepsInEveryKvFormat) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 8);
  for (lode::kv::Format f : lode::kv::all_formats())
    compare_windows(dir / "m.gguf", {.max_context = 512, .step_rows = 4, .kv_format = f},
                    {.max_context = 512, .kv_format = f}, kSizes, lode::kv::to_string(f));
}

// Windows of up to 8 rows (the products' largest group of inputs) and float32 activations (the
// float kernels' several inputs), on lode-mini.
TEST(CudaWindow, RowsGetTheBitsOfOneTokenStepsOnLodeMini) {
  LODE_REQUIRE_GPU();
  const fs::path mini = lode::test::mini_model_path();
  compare_windows(mini, {.max_context = 256, .step_rows = 8}, {.max_context = 256}, {8, 5, 1, 7}, "q8 products");
  constexpr auto f32 = lode::model::Activations::f32;
  compare_windows(mini, {.max_context = 256, .step_rows = 3, .activations = f32}, {.max_context = 256, .activations = f32},
                  {3, 2, 3}, "float32 products");
}

// A window under a budget that holds a third of the experts, whoever computes the absent ones (the
// CPU miss path with all the rows that chose each expert it takes, the GPU reading the rest over
// PCIe, or either alone): the bits of one-token steps with every expert in VRAM. The tier's counts
// say who did: with the CPU path no window reads an expert over PCIe (4 rows of 4 experts are
// within a request's 64 pairs), with the GPU path the CPU computes none.
TEST(CudaWindow, RowsDoNotDependOnWhereTheExpertsAre) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 10);
  const lode::gguf::Reader reader(dir / "m.gguf");
  const auto config = lode::model::read_config(reader.metadata());
  const int64_t third = config.n_layers * config.n_experts / 3;
  for (lode::plan::MissPath path : {lode::plan::MissPath::automatic, lode::plan::MissPath::cpu, lode::plan::MissPath::gpu}) {
    lode::cuda::ExpertStats stats;
    compare_windows(dir / "m.gguf", {.max_context = 256, .step_rows = 4, .max_resident_experts = third, .miss_path = path},
                    {.max_context = 256}, kSizes, std::string("a third of the experts in VRAM, misses ") + to_string(path),
                    &stats);
    lode::test::expect_misses_computed_by(path, stats);
  }
}

// Through the engine interface: a row computed as decode steps (StepRow::as_decode) longer than
// the session's step_rows runs in windows, and gives every position's logits and hidden state as
// one-token steps do; a greedy-only row gives the last position's greedy token; a row is cut within
// its last window (Sequence::cut_window).
TEST(CudaWindow, DecodeRowsThroughTheEngine) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 11);
  const lode::test::LoadedWeights loaded(dir / "m.gguf");
  const auto& [reader, config, weights] = loaded;
  auto model = std::make_shared<lode::cuda::CudaModel>(
      std::make_unique<CudaSession>(reader, weights, CudaSessionOptions{.max_context = 128, .step_rows = 3}));
  CudaSession stepwise(reader, weights, {.max_context = 128});
  const std::unique_ptr<lode::engine::Sequence> sequence = model->open_sequence();
  const std::vector<int32_t> tokens = tokens_from(config.vocab, 7, 3);
  lode::engine::StepRow row{.sequence = sequence.get(), .tokens = tokens, .logit_rows = 7, .want_hidden = true,
                            .as_decode = true};
  model->step(std::span(&row, 1));
  ASSERT_EQ(row.logits.size(), size_t(7 * config.vocab));
  ASSERT_EQ(row.hidden.size(), size_t(7 * config.hidden));
  for (size_t t = 0; t < tokens.size(); ++t) {
    const CudaSession::Window one = stepwise.decode_window(std::span(&tokens[t], 1), false, true);
    ASSERT_TRUE(same_bits(row.logits.data() + t * config.vocab, one.logits.data(), size_t(config.vocab))) << t;
    ASSERT_TRUE(same_bits(row.hidden.data() + t * config.hidden, one.hidden.data(), size_t(config.hidden))) << t;
  }
  const std::vector<int32_t> more = tokens_from(config.vocab, 4, 4);
  lode::engine::StepRow greedy{.sequence = sequence.get(), .tokens = more, .as_decode = true, .greedy_only = true};
  model->step(std::span(&greedy, 1));
  std::vector<float> last;
  for (int32_t t : more) last = stepwise.decode(t);
  EXPECT_EQ(greedy.greedy, std::vector<int32_t>{argmax(last.data(), config.vocab)});
  EXPECT_EQ(sequence->position(), stepwise.position());
  // A row of 5 tokens runs as windows of 3 and 2: it can be cut within its last window only.
  ASSERT_TRUE(sequence->cuts_windows());
  const std::vector<int32_t> five = tokens_from(config.vocab, 5, 5);
  lode::engine::StepRow verify{.sequence = sequence.get(), .tokens = five, .logit_rows = 5, .as_decode = true};
  model->step(std::span(&verify, 1));
  EXPECT_THROW(sequence->cut_window(2), lode::Error);
  sequence->cut_window(4);
  for (size_t t = 0; t < 4; ++t) stepwise.decode(five[t]);
  ASSERT_EQ(sequence->position(), stepwise.position());
  const std::vector<float> after = lode::engine::decode(*sequence, five[0]), want = stepwise.decode(five[0]);
  EXPECT_TRUE(same_bits(after.data(), want.data(), size_t(config.vocab)));
}

// A window cut to its first j tokens (1..T) leaves the state j one-token steps leave: the next
// steps give the same bits; a cut window can be cut again, shorter. Cuts without a window to cut,
// of no tokens or longer than the window, are refused.
TEST(CudaWindow, ACutWindowLeavesTheStateOfTheTokensItKeeps) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 13);
  const lode::test::LoadedWeights loaded(dir / "m.gguf");
  const auto& [reader, config, weights] = loaded;
  CudaSession a(reader, weights, {.max_context = 256, .step_rows = 4}), b(reader, weights, {.max_context = 256});
  const int64_t vocab = config.vocab, hidden = config.hidden;
  const std::vector<int32_t> prompt = tokens_from(vocab, 9, 1);
  a.prefill(prompt);
  b.prefill(prompt);
  int seed = 20;
  // (window tokens, tokens kept, then kept again after a second cut; -1: no second cut)
  for (const auto& [n, keep, again] : std::vector<std::tuple<int, int, int>>{
           {4, 1, -1}, {3, 1, -1}, {4, 4, 2}, {2, 2, 1}, {4, 3, 1}, {3, 2, -1}, {2, 1, -1}}) {
    SCOPED_TRACE(std::to_string(n) + " tokens, keeping " + std::to_string(keep) + " then " + std::to_string(again));
    const std::vector<int32_t> tokens = tokens_from(vocab, n, seed++);
    a.decode_window(tokens);
    a.cut_window(keep);
    if (again >= 0) a.cut_window(again);
    const int kept = again >= 0 ? again : keep;
    for (int t = 0; t < kept; ++t) b.decode(tokens[size_t(t)]);
    ASSERT_EQ(a.position(), b.position());
    const std::vector<int32_t> next = tokens_from(vocab, 1, seed++);
    const CudaSession::Window wa = a.decode_window(next, false, true), wb = b.decode_window(next, false, true);
    ASSERT_TRUE(same_bits(wa.logits.data(), wb.logits.data(), size_t(vocab)));
    ASSERT_TRUE(same_bits(wa.hidden.data(), wb.hidden.data(), size_t(hidden)));
  }
  const auto refused = [&](int64_t keep, const char* why) {
    try {
      a.cut_window(keep);
      ADD_FAILURE() << "cut to " << keep << " was not refused";
    } catch (const lode::Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(0, "no verify window");  // the last step was one token
  a.decode_window(tokens_from(vocab, 3, 40));
  refused(4, "cannot keep 4 tokens of a window of 3");
  refused(0, "cannot keep 0 tokens of a window of 3 (a cut keeps 1 to 3)");
}

TEST(CudaWindow, RefusesMoreTokensThanItsRows) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "q8_0", 12);
  const lode::gguf::Reader reader(dir / "m.gguf");
  const auto config = lode::model::read_config(reader.metadata());
  CudaSession session(reader, config, {.max_context = 64, .step_rows = 2});
  const std::vector<int32_t> three = tokens_from(config.vocab, 3, 5);
  try {
    session.decode_window(three);
    FAIL() << "a window of 3 tokens ran in a session of 2 rows";
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("step_rows"), std::string::npos) << e.what();
  }
  EXPECT_EQ(session.position(), 0);
}

}  // namespace

#else
TEST(CudaWindow, NeedsACudaBuild) { LODE_REQUIRE_GPU(); }
#endif
