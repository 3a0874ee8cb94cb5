// Prompt pieces of several sequences in one pass of the GPU's prompt path (issue 18:
// CudaSession::prefill_pieces, cuda/prompt_pass.h): each piece must get the bits a chunk of its own
// gives (its last row's logits, its rows' hidden states) and leave its sequence where its own chunk
// leaves it (the next decode step's bits): on the quantized synths and lode-mini, every K/V format,
// with most experts in host RAM, through the engine interface and over two shares of the layers.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/fixtures.h"
#include "support/gpu.h"
#include "support/loaded_weights.h"
#include "support/paths.h"
#include "support/step_checks.h"
#include "support/synth_model.h"
#include "test_gguf_helpers.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/engine.h"
#include "cuda/pipeline.h"
#include "cuda/prompt_pass.h"
#include "cuda/session.h"
#include "engine/engine.h"

namespace {

namespace fs = std::filesystem;
using lode::cuda::CudaPipeline;
using lode::cuda::CudaSession;
using lode::cuda::CudaSessionOptions;
using lode::test::same_bits;
using lode::test::synth_model;
using lode::test::tokens_from;

using Loaded = lode::test::LoadedWeights;

// Lengths of the pieces of each pass, a sequence each (sequence i takes the i-th): short and long,
// one token, one exactly kPromptRowAlign long (no padding after it), K/V pages crossed, and a pass
// whose pieces all start where the experts' packed rows do (no packing).
const std::vector<std::vector<int64_t>> kPasses = {
    {37, 64, 5, 100}, {1, 70, 64, 9}, {3, 2, 120, 33}, {64, 128, 64, 7}};

// `together` (several sequences) and one session per sequence with `alone`'s options read the same
// prompts: first a prompt of each sequence's own length, then the passes' pieces, in one pass per
// row of kPasses on `together`, and as a chunk each (prefill_chunk) on its own session. Every
// piece's logits and hidden states must have the same bits, and each sequence's next decode step.
template <class Together>
void compare_pieces(const Loaded& m, Together& together, const CudaSessionOptions& alone, const std::string& what) {
  SCOPED_TRACE(what);
  const int64_t vocab = m.config.vocab, n = int64_t(kPasses.front().size());
  std::vector<std::unique_ptr<CudaSession>> own;
  for (int64_t s = 0; s < n; ++s) {
    own.push_back(std::make_unique<CudaSession>(m.reader, m.weights, alone));
    if (s == 0) continue;  // sequence 0 starts empty
    const std::vector<int32_t> prompt = tokens_from(vocab, int(11 * s), int(s));
    together.use_sequence(s);
    together.prefill(prompt);
    own.back()->prefill(prompt);
  }
  int seed = 10;
  for (const std::vector<int64_t>& lengths : kPasses) {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<CudaSession::Piece> pieces;
    for (size_t s = 0; s < lengths.size(); ++s) {
      tokens.push_back(tokens_from(vocab, int(lengths[s]), seed++));
      pieces.push_back({int64_t(s), tokens.back(), s % 2 == 0 || lengths[s] > 50, s != 1});
    }
    ASSERT_TRUE(together.pieces_fit(lengths));
    const std::vector<CudaSession::PieceOutput> out = together.prefill_pieces(pieces);
    ASSERT_EQ(out.size(), pieces.size());
    for (size_t s = 0; s < pieces.size(); ++s) {
      SCOPED_TRACE("a piece of " + std::to_string(lengths[s]) + " tokens for sequence " + std::to_string(s));
      std::vector<float> hidden;
      const std::vector<float> logits = own[s]->prefill_chunk(tokens[s], false, true, &hidden);
      ASSERT_EQ(out[s].logits.size(), pieces[s].logits ? logits.size() : 0);
      EXPECT_TRUE(same_bits(out[s].logits.data(), logits.data(), out[s].logits.size()));
      ASSERT_EQ(out[s].hidden.size(), pieces[s].hidden ? hidden.size() : 0);
      EXPECT_TRUE(same_bits(out[s].hidden.data(), hidden.data(), out[s].hidden.size()));
    }
  }
  for (int64_t s = 0; s < n; ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s) + " afterwards");
    together.use_sequence(s);
    ASSERT_EQ(together.position(), own[size_t(s)]->position());
    const int32_t next = tokens_from(vocab, 1, 99)[0];
    const std::vector<float> a = together.prefill(std::span(&next, 1)), b = own[size_t(s)]->decode(next);
    EXPECT_TRUE(same_bits(a.data(), b.data(), size_t(vocab)));
  }
}

// Room for four pieces a pass: 4 x 128 rows at most.
constexpr CudaSessionOptions kTogether{.max_context = 512, .step_rows = 4, .sequences = 4, .prompt_chunk = 512};
constexpr CudaSessionOptions kAlone{.max_context = 512, .prompt_chunk = 512};

void compare_on_one_session(const fs::path& path, CudaSessionOptions together, CudaSessionOptions alone,
                            const std::string& what) {
  const Loaded m(path);
  CudaSession s(m.reader, m.weights, together);
  compare_pieces(m, s, alone, what);
}

TEST(CudaPieces, PiecesInOnePassGetTheBitsOfTheirOwnChunks) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "k.gguf", "tiny", "ud-q4_k_xl", 61);
  synth_model(dir / "q8.gguf", "tiny", "q8_0", 62);
  synth_model(dir / "big.gguf", "qwen3.6-35b-a3b", "ud-q4_k_xl", 63, 4);
  for (const char* name : {"k.gguf", "q8.gguf", "big.gguf"}) compare_on_one_session(dir / name, kTogether, kAlone, name);
  compare_on_one_session(lode::test::mini_model_path(), kTogether, kAlone, "lode-mini");
}

TEST(CudaPieces, PiecesInOnePassInEveryKvFormat) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 64);
  for (lode::kv::Format f : lode::kv::all_formats()) {
    CudaSessionOptions together = kTogether, alone = kAlone;
    together.kv_format = alone.kv_format = f;
    compare_on_one_session(dir / "m.gguf", together, alone, lode::kv::to_string(f));
  }
}

// With a third of the experts in VRAM the pass stages the absent ones from host RAM: the bits of
// chunks with every expert in VRAM.
TEST(CudaPieces, PiecesDoNotDependOnWhereTheExpertsAre) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 65);
  const Loaded m(dir / "m.gguf");
  CudaSessionOptions few = kTogether;
  few.max_resident_experts = m.config.n_layers * m.config.n_experts / 3;
  compare_on_one_session(dir / "m.gguf", few, kAlone, "a third of the experts in VRAM");
}

// Two shares of the layers on one GPU hand the pass's rows, padding and all, from one to the other.
TEST(CudaPieces, PiecesOverTwoSharesOfTheLayers) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 66, 8);
  const Loaded m(dir / "m.gguf");
  CudaSessionOptions together = kTogether, alone = kAlone;
  together.vram_budget = alone.vram_budget = size_t(4) << 30;  // every expert in VRAM on both sides
  CudaPipeline shares(m.reader, m.weights, together, std::vector<int>{0, 0});
  compare_pieces(m, shares, alone, "two shares");
}

// Through the engine: a step of three prompt rows (one greedy-only, one wanting hidden states) and
// two one-token rows gives each what its own calls give, the prompts in one pass.
TEST(CudaPieces, PromptRowsOfOneStepShareAPass) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 67);
  const Loaded m(dir / "m.gguf");
  const int64_t vocab = m.config.vocab, hidden = m.config.hidden;
  CudaSessionOptions options = kTogether;
  options.sequences = options.step_rows = 5;
  auto model = std::make_shared<lode::cuda::CudaModel>(std::make_unique<CudaSession>(m.reader, m.weights, options));
  std::vector<std::unique_ptr<lode::engine::Sequence>> open;
  std::vector<std::unique_ptr<CudaSession>> own;
  for (int i = 0; i < 5; ++i) {
    open.push_back(model->open_sequence());
    own.push_back(std::make_unique<CudaSession>(m.reader, m.weights, kAlone));
    const std::vector<int32_t> first = tokens_from(vocab, 4 + 3 * i, i);
    lode::engine::prefill(*open.back(), first, 0);
    own.back()->prefill(first);
  }
  const std::vector<int32_t> p0 = tokens_from(vocab, 30, 7), p2 = tokens_from(vocab, 90, 8), p4 = tokens_from(vocab, 12, 9);
  const int32_t a = tokens_from(vocab, 1, 10)[0], b = tokens_from(vocab, 1, 11)[0];
  std::vector<lode::engine::StepRow> rows = {
      {.sequence = open[0].get(), .tokens = p0},
      {.sequence = open[1].get(), .tokens = std::span(&a, 1)},
      {.sequence = open[2].get(), .tokens = p2, .want_hidden = true},
      {.sequence = open[3].get(), .tokens = std::span(&b, 1)},
      {.sequence = open[4].get(), .tokens = p4, .greedy_only = true}};
  model->step(rows);
  EXPECT_EQ(model->paths().shared_passes, 1) << "the three prompts in one pass";
  EXPECT_EQ(model->paths().joined, 1) << "the two one-token rows in one step";
  std::vector<float> hidden2;
  const std::vector<float> want0 = own[0]->prefill(p0), want2 = own[2]->prefill(p2, false, &hidden2),
                           want4 = own[4]->prefill(p4), want_a = own[1]->decode(a), want_b = own[3]->decode(b);
  EXPECT_TRUE(same_bits(rows[0].logits.data(), want0.data(), size_t(vocab)));
  EXPECT_TRUE(same_bits(rows[1].logits.data(), want_a.data(), size_t(vocab)));
  EXPECT_TRUE(same_bits(rows[2].logits.data(), want2.data(), size_t(vocab)));
  ASSERT_EQ(rows[2].hidden.size(), size_t(90 * hidden));
  EXPECT_TRUE(same_bits(rows[2].hidden.data(), hidden2.data(), hidden2.size()));
  EXPECT_TRUE(same_bits(rows[3].logits.data(), want_b.data(), size_t(vocab)));
  EXPECT_EQ(rows[4].greedy, std::vector<int32_t>{lode::test::argmax(want4.data(), vocab)});
  EXPECT_TRUE(rows[4].logits.empty());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(open[size_t(i)]->position(), own[size_t(i)]->position());
}

// (Host arithmetic: runs without a GPU.) Each piece starts on the first multiple of 64 rows after
// the one before; the last entry is where the last piece ends, its padding not counted.
TEST(CudaPieces, RowStartsAlignEachPiece) {
  using lode::cuda::prompt_row_starts;
  EXPECT_EQ(prompt_row_starts(std::vector<int64_t>{37}), (std::vector<int64_t>{0, 37}));
  EXPECT_EQ(prompt_row_starts(std::vector<int64_t>{37, 64, 5, 100}), (std::vector<int64_t>{0, 64, 128, 192, 292}));
  EXPECT_EQ(prompt_row_starts(std::vector<int64_t>{64, 1, 65}), (std::vector<int64_t>{0, 64, 128, 193}));
  EXPECT_EQ(lode::cuda::kPromptRowAlign, 64);
  EXPECT_THROW(prompt_row_starts(std::vector<int64_t>{5, 0}), lode::Error);
}

// Refused, changing nothing: a sequence with two pieces, pieces spanning more rows than a pass
// holds, an empty piece, a sequence outside the session, a piece past its context (after a valid
// one, which must not move either); more pieces than the session's rows do not fit.
TEST(CudaPieces, RefusesWhatOnePassCannotTake) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "q8_0", 68);
  const Loaded m(dir / "m.gguf");
  const int64_t vocab = m.config.vocab;
  CudaSession s(m.reader, m.weights, {.max_context = 512, .step_rows = 4, .sequences = 4, .prompt_chunk = 256});
  const auto refused = [&](std::vector<CudaSession::Piece> pieces, const char* why) {
    try {
      s.prefill_pieces(pieces);
      ADD_FAILURE() << "not refused: " << why;
    } catch (const lode::Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  const std::vector<int32_t> ten = tokens_from(vocab, 10, 1), long_one = tokens_from(vocab, 200, 2);
  refused({{0, ten}, {0, ten}}, "two prompt pieces");
  refused({{0, long_one}, {1, ten}}, "do not fit one pass");  // 200 + padding to 256, then 10 more
  refused({{0, ten}, {1, {}}}, "do not fit one pass");
  refused({{4, ten}}, "sequence 4");
  const std::vector<int32_t> too_long = tokens_from(vocab, 100, 3);
  s.use_sequence(1);
  s.prefill(tokens_from(vocab, 450, 4));
  refused({{0, ten}, {1, too_long}}, "does not fit the context");
  EXPECT_EQ(s.position(), 450);
  s.reset();
  for (int64_t q = 0; q < 4; ++q) {
    s.use_sequence(q);
    EXPECT_EQ(s.position(), 0);
  }
  const std::vector<int64_t> over = {200, 10}, tight = {190, 64};
  EXPECT_FALSE(s.pieces_fit(over));  // the second starts at row 256
  EXPECT_TRUE(s.pieces_fit(tight));  // the second starts at row 192 and ends at 256
  EXPECT_FALSE(s.pieces_fit(std::vector<int64_t>{10, 10, 10, 10, 10}));  // more pieces than the session's rows
}

}  // namespace

#else
TEST(CudaPieces, NeedsACudaBuild) { LODE_REQUIRE_GPU(); }
#endif
