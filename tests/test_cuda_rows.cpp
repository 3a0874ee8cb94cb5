// Steps of several sequences on the GPU (issue 18): one session holds several sequences, each with
// its own K/V pages, DeltaNet states and position, and a step of rows of different sequences gives
// every row the bits its own one-token step gives (logits, greedy tokens, hidden states) and leaves
// each sequence where its own steps leave it; on the quantized synths, lode-mini, every K/V format,
// a third of the experts in VRAM, beside verify windows and cuts, through the engine interface, and
// with snapshots moved between sequences. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/reader.h"
#include "model/weights.h"
#include "plan/memory_plan.h"
#include "sample/sampler.h"
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
#include "engine/engine.h"

namespace {

namespace fs = std::filesystem;
using lode::cuda::CudaSession;
using lode::cuda::CudaSessionOptions;
using lode::test::argmax;
using lode::test::same_bits;
using lode::test::synth_model;
using lode::test::tokens_from;

using Loaded = lode::test::LoadedWeights;

// The steps the comparison runs: each a list of sequences (a row each, in this order; a sequence
// named in consecutive rows is a verify window of it, cut afterwards to the next of `cuts` when
// there is one), or one sequence's verify window of `window` tokens cut to `keep`.
struct Step {
  std::vector<int64_t> sequences;
  int window = 0, keep = 0;
  std::vector<int> cuts{};  // for the step's windows in order: the tokens each keeps
};

// `batched` holds `n` sequences (prompts of prompt_base + 7 s tokens) and runs `steps`; `alone` (its
// own options, one sequence) is made once per sequence and runs the same tokens one step at a time. Every row must match bit for bit,
// and each sequence's next one-token step after all of them too. With `stats`, what the batched
// session's expert tier did.
void compare_rows(const fs::path& path, CudaSessionOptions batched, CudaSessionOptions alone,
                  const std::vector<Step>& steps, const std::string& what,
                  lode::cuda::ExpertStats* stats = nullptr, int prompt_base = 5) {
  SCOPED_TRACE(what);
  const Loaded m(path);
  const int64_t vocab = m.config.vocab, hidden = m.config.hidden, n = batched.sequences;
  CudaSession many(m.reader, m.weights, batched);
  std::vector<std::unique_ptr<CudaSession>> own;
  for (int64_t s = 0; s < n; ++s) {  // prompts of different lengths: every sequence at its own position
    own.push_back(std::make_unique<CudaSession>(m.reader, m.weights, alone));
    const std::vector<int32_t> prompt = tokens_from(vocab, int(prompt_base + 7 * s), int(s) + 1);
    many.use_sequence(s);
    many.prefill(prompt);
    own.back()->prefill(prompt);
  }
  int seed = 50;
  for (const Step& step : steps) {
    if (step.window > 0) {  // a window of one sequence between steps of several, cut
      const int64_t s = step.sequences.front();
      const std::vector<int32_t> tokens = tokens_from(vocab, step.window, seed++);
      many.use_sequence(s);
      many.decode_window(tokens);
      many.cut_window(step.keep);
      for (int t = 0; t < step.keep; ++t) own[size_t(s)]->decode(tokens[size_t(t)]);
      continue;
    }
    SCOPED_TRACE("a step of " + std::to_string(step.sequences.size()) + " rows");
    std::vector<CudaSession::Row> rows;
    std::vector<int32_t> tokens;
    for (int64_t s : step.sequences) tokens.push_back(tokens_from(vocab, 1, seed++)[0]), rows.push_back({s, tokens.back()});
    const bool greedy = seed % 3 == 0;  // some steps take the greedy tokens, the rest the logits
    const CudaSession::Window w = many.decode_rows(rows, greedy, true);
    size_t cut = 0;
    for (size_t r = 0, end = 0; r < rows.size(); r = end) {  // each sequence's run of rows: its own window
      for (end = r + 1; end < rows.size() && rows[end].sequence == rows[r].sequence;) ++end;
      const int64_t s = rows[r].sequence;
      const CudaSession::Window o = own[size_t(s)]->decode_window(std::span(tokens).subspan(r, end - r), false, true);
      for (size_t i = r; i < end; ++i) {
        ASSERT_TRUE(same_bits(w.hidden.data() + i * hidden, o.hidden.data() + (i - r) * hidden, size_t(hidden))) << "row " << i;
        if (greedy) ASSERT_EQ(w.greedy[i], argmax(o.logits.data() + (i - r) * vocab, vocab)) << "row " << i;
        else ASSERT_TRUE(same_bits(w.logits.data() + i * vocab, o.logits.data() + (i - r) * vocab, size_t(vocab))) << "row " << i;
      }
      if (end - r > 1 && cut < step.cuts.size()) {  // cut as its own window is cut
        many.use_sequence(s);
        many.cut_window(step.cuts[cut]);
        own[size_t(s)]->cut_window(step.cuts[cut++]);
      }
    }
  }
  for (int64_t s = 0; s < n; ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s) + " afterwards");
    many.use_sequence(s);
    ASSERT_EQ(many.position(), own[size_t(s)]->position());
    const int32_t next = tokens_from(vocab, 1, 99)[0];
    const std::vector<float> a = many.decode(next), b = own[size_t(s)]->decode(next);
    EXPECT_TRUE(same_bits(a.data(), b.data(), size_t(vocab)));
  }
  if (stats) *stats = many.expert_stats();
}

// Rows of all the sequences, some, one, in changing orders, and windows of one sequence (cut)
// between them.
const std::vector<Step> kSteps = {{{0, 1, 2, 3, 4}}, {{3, 1}},    {{4}},         {{2}, 3, 1}, {{2, 0, 4}},
                                  {{1, 2, 3, 4, 0}}, {{0}, 4, 4}, {{4, 3, 2, 1}}, {{0, 2}}};

TEST(CudaRows, RowsOfSeveralSequencesGetTheBitsOfTheirOwnSteps) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "k.gguf", "tiny", "ud-q4_k_xl", 21);
  synth_model(dir / "q8.gguf", "tiny", "q8_0", 22);
  synth_model(dir / "big.gguf", "qwen3.6-35b-a3b", "ud-q4_k_xl", 23, 4);
  for (const char* name : {"k.gguf", "q8.gguf", "big.gguf"})
    compare_rows(dir / name, {.max_context = 256, .step_rows = 5, .sequences = 5}, {.max_context = 256}, kSteps, name);
}

// Steps of 16 rows and more: the experts by expert groups with every expert in VRAM (the tiny
// synth's 16 experts, 4 a row: groups of several pairs each), and plain products of more inputs
// than a block takes.
TEST(CudaRows, StepsOfManyRowsGetTheBitsOfTheirOwnSteps) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "k.gguf", "tiny", "ud-q4_k_xl", 25);
  std::vector<int64_t> all(17), sixteen(16);
  std::iota(all.begin(), all.end(), 0);
  std::iota(sixteen.rbegin(), sixteen.rend(), 1);  // 16 .. 1
  const std::vector<Step> steps = {{all}, {sixteen}, {{5, 9}}, {all}};
  compare_rows(dir / "k.gguf", {.max_context = 128, .step_rows = 17, .sequences = 17}, {.max_context = 128}, steps,
               "17 sequences");
}

// Verify windows of several sequences in one step (a sequence's consecutive rows, beside one-token
// rows of others): every row the bits of its sequence's own window, and each window then cut (or
// not) as its own is, so that the sequences go on where their own cut windows leave them; between
// them steps of one token each, and a window of one sequence alone.
TEST(CudaRows, WindowsOfSeveralSequencesInOneStepGetTheBitsOfTheirOwnWindows) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "k.gguf", "tiny", "ud-q4_k_xl", 29);
  synth_model(dir / "big.gguf", "qwen3.6-35b-a3b", "ud-q4_k_xl", 30, 4);
  const std::vector<Step> steps = {
      {{0, 0, 0, 1, 2, 2}, 0, 0, {2, 1}},  // sequence 0 keeps 2 of 3, sequence 2 1 of 2
      {{3, 1, 1}, 0, 0, {2}},              // a window kept whole
      {{0, 1, 2, 3, 4}},
      {{4, 4, 4, 4, 2, 2, 0}, 0, 0, {1, 1}},  // each window cut to its first token
      {{2}, 3, 2},
      {{1, 1, 3, 3, 3}, 0, 0, {1, 3}},
      {{4, 3, 2, 1, 0}}};
  for (const char* name : {"k.gguf", "big.gguf"})  // (prompts of 58 + 7 s tokens: windows cross K/V pages of 64)
    compare_rows(dir / name, {.max_context = 256, .step_rows = 8, .sequences = 5}, {.max_context = 256, .step_rows = 4},
                 steps, name, nullptr, 58);
}

TEST(CudaRows, RowsOfSeveralSequencesInEveryKvFormat) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 24);
  for (lode::kv::Format f : lode::kv::all_formats())
    compare_rows(dir / "m.gguf", {.max_context = 320, .step_rows = 5, .sequences = 5, .kv_format = f},
                 {.max_context = 320, .kv_format = f}, kSteps, lode::kv::to_string(f));
}

TEST(CudaRows, RowsOfSeveralSequencesOnLodeMini) {
  LODE_REQUIRE_GPU();
  const fs::path mini = lode::test::mini_model_path();
  compare_rows(mini, {.max_context = 256, .step_rows = 8, .sequences = 5}, {.max_context = 256}, kSteps, "q8 products");
  constexpr auto f32 = lode::model::Activations::f32;
  compare_rows(mini, {.max_context = 256, .step_rows = 5, .sequences = 5, .activations = f32},
               {.max_context = 256, .activations = f32}, kSteps, "float32 products");
}

// Under a budget that holds a third of the experts, a step of several rows gives some absent
// experts to the CPU miss path with all the rows that chose them and reads the rest over PCIe (or
// gives the CPU all it can hold, or none): the bits of one-token steps with every expert in VRAM.
// The bits cannot tell who computed an expert, so the tier's counts say it: with the CPU path no
// decode step, of one row or several, reads an expert over PCIe (5 rows of 4 experts are within a
// request's 64 pairs), with the GPU path the CPU computes none. 17 rows of the tiny synth's 4
// experts each, with no expert in VRAM, pass the most pairs a request holds: the CPU takes 64 of
// each layer's 68 at most, the GPU the rest.
TEST(CudaRows, RowsDoNotDependOnWhereTheExpertsAre) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 25);
  const Loaded m(dir / "m.gguf");
  const int64_t third = m.config.n_layers * m.config.n_experts / 3;
  for (lode::plan::MissPath path : {lode::plan::MissPath::automatic, lode::plan::MissPath::cpu, lode::plan::MissPath::gpu}) {
    lode::cuda::ExpertStats stats;
    compare_rows(dir / "m.gguf",
                 {.max_context = 256, .step_rows = 5, .sequences = 5, .max_resident_experts = third, .miss_path = path},
                 {.max_context = 256}, kSteps, std::string("a third of the experts in VRAM, misses ") + to_string(path),
                 &stats);
    lode::test::expect_misses_computed_by(path, stats);
  }
  std::vector<int64_t> all(17);
  std::iota(all.begin(), all.end(), 0);
  lode::cuda::ExpertStats stats;
  compare_rows(dir / "m.gguf",
               {.max_context = 128, .step_rows = 17, .sequences = 17, .max_resident_experts = 0,
                .miss_path = lode::plan::MissPath::cpu},
               {.max_context = 128}, {{all}, {{5, 9}}, {all}}, "17 sequences, no expert in VRAM", &stats);
  EXPECT_GT(stats.cpu_experts, 0u) << stats.miss_path;
  EXPECT_GT(stats.decode_miss_bytes, 0u) << stats.miss_path;
}

// A step grouped by expert reads an absent expert over PCIe once a group (at most 8 of its rows),
// whatever its rows: the tier's count of the bytes decode reads over PCIe says so, not once a
// routing. 17 rows of the tiny synth's 4 experts each, with no expert in VRAM and every miss on the
// GPU: the step's groups, from the routing counts it added, against the bytes it counted.
TEST(CudaRows, AGroupedStepCountsAnAbsentExpertOnceAGroup) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 27);
  const Loaded m(dir / "m.gguf");
  const int64_t n = 17, layers = m.config.n_layers, experts = m.config.n_experts;
  CudaSession s(m.reader, m.weights,
                {.max_context = 64, .step_rows = n, .sequences = n, .max_resident_experts = 0,
                 .miss_path = lode::plan::MissPath::gpu});
  std::vector<CudaSession::Row> rows;
  for (int64_t q = 0; q < n; ++q) {
    s.use_sequence(q);
    s.prefill(tokens_from(m.config.vocab, 6, int(q) + 1));
    rows.push_back({q, int32_t(q + 3)});
  }
  const std::vector<uint64_t> counts_before = s.routing_counts();
  const lode::cuda::ExpertStats before = s.expert_stats();
  s.decode_rows(rows, true);
  const std::vector<uint64_t> counts = s.routing_counts();
  const lode::cuda::ExpertStats after = s.expert_stats();
  const std::vector<lode::plan::ExpertBytes> bytes = lode::plan::expert_bytes(*m.weights);
  uint64_t want = 0, routings = 0;
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t e = 0; e < experts; ++e) {
      const uint64_t c = counts[size_t(l * experts + e)] - counts_before[size_t(l * experts + e)];
      want += (c + 7) / 8 * bytes[size_t(l)].total();
      routings += c;
    }
  ASSERT_EQ(routings, uint64_t(n * layers * m.config.n_experts_used));
  EXPECT_EQ(after.missed - before.missed, routings);  // (none in VRAM)
  EXPECT_EQ(after.decode_miss_bytes - before.decode_miss_bytes, want);
  EXPECT_EQ(after.cpu_experts, 0u);
}

// A snapshot of one sequence restored into another continues as the first does; resetting one
// sequence leaves the others as they were.
TEST(CudaRows, SnapshotsMoveBetweenSequences) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 26);
  const Loaded m(dir / "m.gguf");
  const int64_t vocab = m.config.vocab;
  CudaSession s(m.reader, m.weights, {.max_context = 256, .step_rows = 3, .sequences = 3});
  s.use_sequence(0);
  s.prefill(tokens_from(vocab, 40, 1));
  const CudaSession::Snapshot at40 = s.save();
  s.use_sequence(2);
  s.prefill(tokens_from(vocab, 9, 2));
  s.restore(at40);
  EXPECT_EQ(s.position(), 40);
  s.use_sequence(1);
  s.prefill(tokens_from(vocab, 13, 3));
  s.reset();  // sequence 1 only
  EXPECT_EQ(s.position(), 0);
  const int32_t next = tokens_from(vocab, 1, 4)[0];
  const CudaSession::Window both = s.decode_rows(std::vector<CudaSession::Row>{{0, next}, {2, next}});
  EXPECT_TRUE(same_bits(both.logits.data(), both.logits.data() + vocab, size_t(vocab)));
  s.use_sequence(1);
  EXPECT_EQ(s.position(), 0);
}

// A kept prefix's DeltaNet states sit in page-locked memory (copied at the link's speed), and the
// block of a prefix let go is the next one's; two prefixes held at once have blocks of their own.
TEST(CudaRows, KeptPrefixesHoldTheirStatesInReusedPinnedBlocks) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 29);
  const Loaded m(dir / "m.gguf");
  CudaSession s(m.reader, m.weights, {.max_context = 128, .prompt_chunk = 16});
  s.prefill(tokens_from(m.config.vocab, 20, 1));
  std::shared_ptr<const CudaSession::Prefix> first = s.keep();
  ASSERT_TRUE(first->states.pinned());
  const float* block = first->states.data();
  const std::vector<float> held(first->states.data(), first->states.data() + first->states.size());
  first.reset();
  const std::shared_ptr<const CudaSession::Prefix> again = s.keep(), beside = s.keep();
  EXPECT_EQ(again->states.data(), block);
  EXPECT_NE(beside->states.data(), block);
  EXPECT_TRUE(beside->states.pinned());
  EXPECT_TRUE(std::equal(held.begin(), held.end(), again->states.data()));  // (the same states again)
}

// Floats a pool cannot hold (its blocks too small) are in ordinary memory, as they are where no
// page-locked memory can be had (no GPU); either way they are the floats asked for.
TEST(CudaRows, HostFloatsTooLargeForThePoolAreOrdinaryMemory) {
  auto pool = std::make_shared<lode::cuda::PinnedBlocks>(64);
  lode::cuda::HostFloats large(pool, 100);
  EXPECT_FALSE(large.pinned());
  ASSERT_EQ(large.size(), 100u);
  large.data()[99] = 3.0f;
  lode::cuda::HostFloats moved = std::move(large);
  EXPECT_EQ(moved.data()[99], 3.0f);
  EXPECT_EQ(large.size(), 0u);
}

// A kept prefix (the engine's checkpoints) shares its K/V pages instead of copying them: a sequence
// resumed from another's prefix, and the first one going on and coming back to it, each continue
// as a fresh sequence fed the same tokens does, bit for bit, though both write into the prefix's
// half-full last page (copied on write) in one step of two rows. With no page free (one sequence
// whose new text needs every page, the prefix's too), the prefix moves its cells to host memory
// first, and still resumes.
TEST(CudaRows, KeptPrefixesSharePagesAndContinueAsAFreshSequence) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 29);
  const Loaded m(dir / "m.gguf");
  const int64_t vocab = m.config.vocab;
  const CudaSessionOptions one{.max_context = 256, .prompt_chunk = 16};
  const std::vector<int32_t> prompt = tokens_from(vocab, 100, 1);  // a page and a half
  const std::vector<int32_t> x = tokens_from(vocab, 3, 2), y = tokens_from(vocab, 3, 3);
  // What a fresh sequence gives for the prompt, then each of `next`.
  const auto fresh = [&](const std::vector<int32_t>& next) {
    CudaSession f(m.reader, m.weights, one);
    f.prefill(prompt);
    std::vector<std::vector<float>> out;
    for (int32_t t : next) out.push_back(f.decode(t));
    return out;
  };
  const auto want_x = fresh(x), want_y = fresh(y);

  CudaSession s(m.reader, m.weights, {.max_context = 256, .step_rows = 2, .sequences = 2, .prompt_chunk = 16});
  s.use_sequence(0);
  s.prefill(prompt);
  const std::shared_ptr<const CudaSession::Prefix> kept = s.keep();
  EXPECT_EQ(kept->positions(), 100);
  const int64_t states_bytes = kept->host_bytes();  // its cells stay on the pages
  s.use_sequence(1);
  s.resume(*kept);
  EXPECT_EQ(s.position(), 100);
  for (size_t t = 0; t < x.size(); ++t) {
    const CudaSession::Window w = s.decode_rows(std::vector<CudaSession::Row>{{0, x[t]}, {1, y[t]}});
    EXPECT_TRUE(same_bits(w.logits.data(), want_x[t].data(), size_t(vocab))) << "sequence 0, token " << t;
    EXPECT_TRUE(same_bits(w.logits.data() + vocab, want_y[t].data(), size_t(vocab))) << "sequence 1, token " << t;
  }
  s.use_sequence(0);
  s.resume(*kept);  // back to its own prefix after going another way
  for (size_t t = 0; t < y.size(); ++t)
    EXPECT_TRUE(same_bits(s.decode(y[t]).data(), want_y[t].data(), size_t(vocab))) << "back at the prefix, token " << t;
  EXPECT_EQ(kept->host_bytes(), states_bytes);

  // One sequence of four pages, two of them held (the context as above: the prompt pass's shapes
  // follow it).
  CudaSession alone(m.reader, m.weights, one);
  alone.prefill(prompt);
  const auto held = alone.keep();
  alone.reset();
  alone.prefill(tokens_from(vocab, 250, 4));  // needs all four pages: the held ones' cells go to the host
  EXPECT_GT(held->host_bytes(), states_bytes);
  alone.resume(*held);
  for (size_t t = 0; t < x.size(); ++t)
    EXPECT_TRUE(same_bits(alone.decode(x[t]).data(), want_x[t].data(), size_t(vocab))) << "from the host, token " << t;
  EXPECT_THROW(s.resume(*held), lode::Error);  // another session's
}

// Two sequences sharing a pool of five pages (kv_positions 320) where each could hold four: a
// promise beyond the pool is refused, steps of both give the bits of sequences with room for all,
// a reset gives the pages back, a sequence writing past its promise into a pool whose pages are
// all promised is refused, saying why, and pages used by one sequence then another give the bits.
TEST(CudaRows, ASharedKvPoolServesWhatItPromised) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 30);
  const Loaded m(dir / "m.gguf");
  const int64_t vocab = m.config.vocab;
  const CudaSessionOptions roomy{.max_context = 256, .prompt_chunk = 16};
  CudaSession s(m.reader, m.weights,
                {.max_context = 256, .step_rows = 2, .sequences = 2, .kv_positions = 320, .prompt_chunk = 16});
  EXPECT_EQ(s.kv_pool_positions(), 320);
  const std::vector<int32_t> a = tokens_from(vocab, 150, 1), b = tokens_from(vocab, 40, 2);
  s.use_sequence(0);
  EXPECT_TRUE(s.reserve_kv(200));   // four pages
  s.use_sequence(1);
  EXPECT_FALSE(s.reserve_kv(128));  // two more do not fit
  EXPECT_TRUE(s.reserve_kv(64));
  s.use_sequence(0);
  s.prefill(a);
  s.use_sequence(1);
  s.prefill(b);
  CudaSession fresh_a(m.reader, m.weights, roomy), fresh_b(m.reader, m.weights, roomy);
  fresh_a.prefill(a);
  fresh_b.prefill(b);
  const std::vector<int32_t> x = tokens_from(vocab, 3, 3), y = tokens_from(vocab, 3, 4);
  for (size_t t = 0; t < x.size(); ++t) {
    const CudaSession::Window w = s.decode_rows(std::vector<CudaSession::Row>{{0, x[t]}, {1, y[t]}});
    EXPECT_TRUE(same_bits(w.logits.data(), fresh_a.decode(x[t]).data(), size_t(vocab))) << "sequence 0, token " << t;
    EXPECT_TRUE(same_bits(w.logits.data() + vocab, fresh_b.decode(y[t]).data(), size_t(vocab))) << "sequence 1, token " << t;
  }
  s.use_sequence(0);
  s.reset();  // its three pages back
  EXPECT_TRUE(s.reserve_kv(0));
  s.use_sequence(1);
  EXPECT_TRUE(s.reserve_kv(256));  // now all four of its own
  s.use_sequence(0);
  try {
    s.prefill(tokens_from(vocab, 70, 5));  // two pages: the one nobody is promised, then none
    ADD_FAILURE() << "a sequence took pages promised to another";
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("reserved"), std::string::npos) << e.what();
  }
  // The refusal harmed neither: sequence 1 goes on as its fresh twin, and sequence 0, reset, reads
  // a prompt into pages the others used before and gets the fresh bits.
  s.use_sequence(1);
  for (int32_t t : x) EXPECT_TRUE(same_bits(s.decode(t).data(), fresh_b.decode(t).data(), size_t(vocab)));
  s.use_sequence(0);
  s.reset();
  EXPECT_TRUE(s.reserve_kv(64));
  CudaSession fresh_c(m.reader, m.weights, roomy);
  const std::vector<int32_t> c = tokens_from(vocab, 50, 6);
  EXPECT_TRUE(same_bits(s.prefill(c).data(), fresh_c.prefill(c).data(), size_t(vocab)));
}

// Through the engine: a model of three sequences opens three and refuses a fourth; a step of a
// prompt row, one-token rows and a greedy-only row gives each what its own steps give; a closed
// sequence's place is opened again, empty.
TEST(CudaRows, SeveralSequencesThroughTheEngine) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 27);
  const Loaded m(dir / "m.gguf");
  const int64_t vocab = m.config.vocab;
  auto model = std::make_shared<lode::cuda::CudaModel>(std::make_unique<CudaSession>(
      m.reader, m.weights, CudaSessionOptions{.max_context = 128, .step_rows = 3, .sequences = 3}));
  std::vector<std::unique_ptr<lode::engine::Sequence>> open;
  for (int i = 0; i < 3; ++i) open.push_back(model->open_sequence());
  EXPECT_THROW(model->open_sequence(), lode::Error);
  std::vector<std::unique_ptr<CudaSession>> own;
  const std::vector<int32_t> first = tokens_from(vocab, 6, 1), second = tokens_from(vocab, 11, 2);
  for (int i = 0; i < 3; ++i)
    own.push_back(std::make_unique<CudaSession>(m.reader, m.weights, CudaSessionOptions{.max_context = 128}));
  lode::engine::prefill(*open[0], first, 0);
  own[0]->prefill(first);
  lode::engine::prefill(*open[1], second, 0);
  own[1]->prefill(second);
  const std::vector<int32_t> prompt = tokens_from(vocab, 17, 3);
  const int32_t a = tokens_from(vocab, 1, 4)[0], b = tokens_from(vocab, 1, 5)[0];
  std::vector<lode::engine::StepRow> rows = {
      {.sequence = open[2].get(), .tokens = prompt},
      {.sequence = open[0].get(), .tokens = std::span(&a, 1)},
      {.sequence = open[1].get(), .tokens = std::span(&b, 1), .greedy_only = true}};
  model->step(rows);
  const std::vector<float> want_prompt = own[2]->prefill(prompt), want_a = own[0]->decode(a), want_b = own[1]->decode(b);
  EXPECT_TRUE(same_bits(rows[0].logits.data(), want_prompt.data(), size_t(vocab)));
  EXPECT_TRUE(same_bits(rows[1].logits.data(), want_a.data(), size_t(vocab)));
  EXPECT_EQ(rows[2].greedy, std::vector<int32_t>{argmax(want_b.data(), vocab)});
  EXPECT_TRUE(rows[2].logits.empty());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(open[size_t(i)]->position(), own[size_t(i)]->position());
  // A sequence in two rows of one step is refused, changing nothing.
  std::vector<lode::engine::StepRow> twice = {{.sequence = open[0].get(), .tokens = std::span(&a, 1)},
                                              {.sequence = open[0].get(), .tokens = std::span(&b, 1)}};
  EXPECT_THROW(model->step(twice), lode::Error);
  EXPECT_EQ(open[0]->position(), own[0]->position());
  open[1].reset();  // closed with 12 positions; opened again, empty
  open[1] = model->open_sequence();
  EXPECT_EQ(open[1]->position(), 0);
  const std::vector<float> fresh = lode::engine::prefill(*open[1], first, 0);
  CudaSession again(m.reader, m.weights, CudaSessionOptions{.max_context = 128});
  const std::vector<float> want = again.prefill(first);
  EXPECT_TRUE(same_bits(fresh.data(), want.data(), size_t(vocab)));
}

// Through the engine: verify windows (as_decode rows) of two sequences beside a one-token row of a
// third run as one step of the session, each answered as it asks (every row's greedy token and
// hidden state, every row's logits, one row's logits), and a window is then cut through its
// sequence: each sequence goes on as its own steps and cut leave it.
TEST(CudaRows, WindowsOfSeveralSequencesThroughTheEngine) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 31);
  const Loaded m(dir / "m.gguf");
  const int64_t vocab = m.config.vocab, hidden = m.config.hidden;
  auto model = std::make_shared<lode::cuda::CudaModel>(std::make_unique<CudaSession>(
      m.reader, m.weights, CudaSessionOptions{.max_context = 128, .step_rows = 6, .sequences = 3}));
  std::vector<std::unique_ptr<lode::engine::Sequence>> open;
  std::vector<std::unique_ptr<CudaSession>> own;
  for (int i = 0; i < 3; ++i) {
    open.push_back(model->open_sequence());
    own.push_back(std::make_unique<CudaSession>(m.reader, m.weights, CudaSessionOptions{.max_context = 128, .step_rows = 3}));
    const std::vector<int32_t> prompt = tokens_from(vocab, 4 + 5 * i, i + 1);
    lode::engine::prefill(*open.back(), prompt, 0);
    own.back()->prefill(prompt);
  }
  const std::vector<int32_t> a = tokens_from(vocab, 3, 7), b = tokens_from(vocab, 2, 8);
  const int32_t c = tokens_from(vocab, 1, 9)[0];
  std::vector<lode::engine::StepRow> rows = {
      {.sequence = open[0].get(), .tokens = a, .logit_rows = 3, .want_hidden = true, .as_decode = true, .greedy_only = true},
      {.sequence = open[1].get(), .tokens = b, .logit_rows = 2, .as_decode = true},
      {.sequence = open[2].get(), .tokens = std::span(&c, 1)}};
  const int64_t alone = model->paths().alone;
  model->step(rows);
  EXPECT_EQ(model->paths().joined_windows, 1);
  EXPECT_EQ(model->paths().alone, alone);  // (no row ran alone)
  const CudaSession::Window wa = own[0]->decode_window(a, false, true), wb = own[1]->decode_window(b);
  const std::vector<float> wc = own[2]->decode(c);
  ASSERT_EQ(rows[0].greedy.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(rows[0].greedy[size_t(r)], argmax(wa.logits.data() + r * vocab, vocab)) << r;
  ASSERT_EQ(rows[0].hidden.size(), size_t(3 * hidden));
  EXPECT_TRUE(same_bits(rows[0].hidden.data(), wa.hidden.data(), size_t(3 * hidden)));
  ASSERT_EQ(rows[1].logits.size(), size_t(2 * vocab));
  EXPECT_TRUE(same_bits(rows[1].logits.data(), wb.logits.data(), size_t(2 * vocab)));
  ASSERT_EQ(rows[2].logits.size(), size_t(vocab));
  EXPECT_TRUE(same_bits(rows[2].logits.data(), wc.data(), size_t(vocab)));
  open[0]->cut_window(3);  // (all of it: nothing to cut)
  open[1]->cut_window(1), own[1]->cut_window(1);  // a window whose kept states start at the step's row 3
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i) + " afterwards");
    ASSERT_EQ(open[size_t(i)]->position(), own[size_t(i)]->position());
    const int32_t next = tokens_from(vocab, 1, 20 + i)[0];
    const std::vector<float> x = lode::engine::decode(*open[size_t(i)], next), y = own[size_t(i)]->decode(next);
    EXPECT_TRUE(same_bits(x.data(), y.data(), size_t(vocab)));
  }
  // Windows of several sequences that one step cannot keep the states of are refused, changing
  // nothing: 3 + 4 tokens in a session that keeps 6 rows.
  const std::vector<int32_t> four = tokens_from(vocab, 4, 10);
  std::vector<lode::engine::StepRow> too_many = {
      {.sequence = open[0].get(), .tokens = a, .logit_rows = 3, .as_decode = true},
      {.sequence = open[1].get(), .tokens = four, .logit_rows = 4, .as_decode = true}};
  const int64_t before = open[0]->position();
  try {
    model->step(too_many);
    ADD_FAILURE() << "not refused";
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("window_rows"), std::string::npos) << e.what();
  }
  EXPECT_EQ(open[0]->position(), before);
}

// A step of rows that asks for top candidates (decode_rows' `top`) gives each row the
// sample::top_candidates of the logits a step asking for logits gives it (with the ids some rows
// set aside: a few, then the best of the step before), and leaves the sequences as that step does;
// through the engine, top-only rows beside greedy-only and logits rows get what each asks for, a
// sampler's draws from them what it draws from the whole row (with a bias and penalties too).
TEST(CudaRows, TopCandidatesOfAStepAreThoseOfItsLogits) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "ud-q4_k_xl", 31);
  for (const fs::path& path : {dir / "m.gguf", lode::test::mini_model_path()}) {
    SCOPED_TRACE(path.filename().string());
    const Loaded m(path);
    const int64_t vocab = m.config.vocab;
    const CudaSessionOptions options{.max_context = 128, .step_rows = 4, .sequences = 4};
    CudaSession a(m.reader, m.weights, options), b(m.reader, m.weights, options);
    for (int64_t s = 0; s < 4; ++s) {
      const std::vector<int32_t> prompt = tokens_from(vocab, int(3 + 4 * s), int(s) + 1);
      a.use_sequence(s), b.use_sequence(s);
      a.prefill(prompt), b.prefill(prompt);
    }
    std::vector<std::vector<int32_t>> aside = {{0, 3, int32_t(vocab - 1)}, {}, {1}, {}};
    for (int step = 0; step < 3; ++step) {
      std::vector<CudaSession::Row> rows;
      for (int64_t s : {2, 0, 3, 1}) rows.push_back({s, tokens_from(vocab, 1, 40 + step * 4 + int(s))[0]});
      const CudaSession::Window logits = b.decode_rows(rows);
      for (size_t r = 0; r < rows.size(); ++r) rows[r].aside = aside[r];
      const CudaSession::Window top = a.decode_rows(rows, false, false, true);
      ASSERT_TRUE(top.logits.empty());
      for (size_t r = 0; r < rows.size(); ++r) {
        const lode::sample::TopCandidates want = lode::sample::top_candidates(
            std::span(logits.logits).subspan(r * size_t(vocab), size_t(vocab)), lode::sample::kTopCandidates, aside[r]);
        ASSERT_EQ(top.finite[r], want.finite) << "row " << r;
        ASSERT_EQ(top.aside.at(r).size(), want.aside.size()) << "row " << r;
        for (size_t i = 0; i < want.aside.size(); ++i) {
          EXPECT_EQ(top.aside[r][i].id, want.aside[i].id);
          EXPECT_EQ(std::bit_cast<uint32_t>(top.aside[r][i].logit), std::bit_cast<uint32_t>(want.aside[i].logit));
        }
        std::vector<std::pair<int32_t, uint32_t>> got, expected;  // (bits: -0 is not +0)
        for (size_t i = 0; i < want.best.size(); ++i) {
          const lode::sample::Scored& c = top.top[r * lode::sample::kTopCandidates + i];
          got.push_back({c.id, std::bit_cast<uint32_t>(c.logit)});
        }
        for (const lode::sample::Scored& c : want.best) expected.push_back({c.id, std::bit_cast<uint32_t>(c.logit)});
        std::sort(got.begin(), got.end()), std::sort(expected.begin(), expected.end());
        EXPECT_EQ(got, expected) << "row " << r;
        if (r % 2 == 0) {  // the next step sets aside this one's best 30 (they crowd its candidates)
          aside[r].clear();
          for (size_t i = 0; i < std::min<size_t>(30, want.best.size()); ++i) aside[r].push_back(want.best[i].id);
          std::sort(aside[r].begin(), aside[r].end());
        }
      }
    }
    const int32_t next = tokens_from(vocab, 1, 77)[0];
    for (int64_t s = 0; s < 4; ++s) {
      a.use_sequence(s), b.use_sequence(s);
      EXPECT_TRUE(same_bits(a.decode(next).data(), b.decode(next).data(), size_t(vocab))) << "sequence " << s;
    }
  }
  // Through the engine.
  const Loaded m(dir / "m.gguf");
  const int64_t vocab = m.config.vocab;
  auto model = std::make_shared<lode::cuda::CudaModel>(std::make_unique<CudaSession>(
      m.reader, m.weights, CudaSessionOptions{.max_context = 128, .step_rows = 3, .sequences = 3}));
  std::vector<std::unique_ptr<lode::engine::Sequence>> open;
  std::vector<std::unique_ptr<CudaSession>> own;
  for (int i = 0; i < 3; ++i) {
    open.push_back(model->open_sequence());
    own.push_back(std::make_unique<CudaSession>(m.reader, m.weights, CudaSessionOptions{.max_context = 128}));
    const std::vector<int32_t> prompt = tokens_from(vocab, 5 + i, 10 + i);
    lode::engine::prefill(*open.back(), prompt, 0);
    own.back()->prefill(prompt);
  }
  const int32_t x = tokens_from(vocab, 1, 20)[0], y = tokens_from(vocab, 1, 21)[0], z = tokens_from(vocab, 1, 22)[0];
  for (bool with_logits_row : {false, true}) {  // (device top candidates; then the logits for all)
    SCOPED_TRACE(with_logits_row ? "beside a logits row" : "top and greedy rows only");
    // Row 0's sampler has a bias and penalties over its prompt: its ids set aside.
    lode::sample::SamplingParams params{.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 5};
    lode::sample::SamplingParams changed = params;
    changed.repeat_penalty = 1.3f, changed.presence_penalty = 0.5f, changed.logit_bias = {{x, 4.0f}, {y, -INFINITY}};
    lode::sample::Sampler whole_0(changed, vocab), from_top_0(changed, vocab);
    for (const int32_t t : tokens_from(vocab, 5, 10)) whole_0.accept(t), from_top_0.accept(t);
    const std::vector<int32_t> aside_0 = from_top_0.top_aside();
    std::vector<lode::engine::StepRow> rows = {
        {.sequence = open[0].get(), .tokens = std::span(&x, 1), .top_only = true, .top_aside = aside_0},
        {.sequence = open[1].get(), .tokens = std::span(&y, 1), .greedy_only = !with_logits_row},
        {.sequence = open[2].get(), .tokens = std::span(&z, 1), .top_only = true}};
    const lode::cuda::CudaModel::Paths before = model->paths();
    model->step(rows);
    EXPECT_EQ(model->paths().joined, before.joined + 1) << "one step of the three rows";
    EXPECT_EQ(model->paths().joined_top, before.joined_top + (with_logits_row ? 0 : 1)) << "candidates on the device";
    const std::vector<float> want_x = own[0]->decode(x), want_y = own[1]->decode(y), want_z = own[2]->decode(z);
    EXPECT_TRUE(rows[0].logits.empty());
    for (int draw = 0; draw < 50; ++draw) ASSERT_EQ(whole_0.sample(want_x), from_top_0.sample_top(rows[0].top));
    EXPECT_TRUE(rows[2].logits.empty());
    lode::sample::Sampler whole(params, vocab), from_top(params, vocab);
    for (int draw = 0; draw < 50; ++draw) ASSERT_EQ(whole.sample(want_z), from_top.sample_top(rows[2].top));
    if (with_logits_row) EXPECT_TRUE(same_bits(rows[1].logits.data(), want_y.data(), size_t(vocab)));
    else EXPECT_EQ(rows[1].greedy, std::vector<int32_t>{argmax(want_y.data(), vocab)});
  }
}

// Refused: more sequences than rows, a sequence's rows apart in a step or a sequence outside the
// session, a cut of a window whose kept states another sequence's window has since written over, and
// a window longer than the session keeps states for, alone or in a step of several sequences.
TEST(CudaRows, RefusesWhatItCannotHold) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  synth_model(dir / "m.gguf", "tiny", "q8_0", 28);
  const Loaded m(dir / "m.gguf");
  const auto refused = [&](const auto& call, const char* why) {
    try {
      call();
      ADD_FAILURE() << "not refused: " << why;
    } catch (const lode::Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused([&] { CudaSession s(m.reader, m.weights, {.max_context = 64, .step_rows = 2, .sequences = 3}); },
          "3 sequences");
  CudaSession s(m.reader, m.weights, {.max_context = 64, .step_rows = 3, .sequences = 3});
  const std::vector<CudaSession::Row> twice = {{1, 5}, {2, 6}, {1, 7}};
  refused([&] { s.decode_rows(twice); }, "rows apart");
  const std::vector<CudaSession::Row> outside = {{3, 5}};
  refused([&] { s.decode_rows(outside); }, "sequence 3");
  refused([&] { s.use_sequence(-1); }, "sequence -1");
  s.use_sequence(1);
  EXPECT_EQ(s.position(), 0);
  // One set of kept window states: a window of another sequence ends this one's, which can no
  // longer be cut; the other's can.
  const std::vector<int32_t> two = {5, 6};
  s.decode_window(two);
  s.use_sequence(2);
  s.decode_window(two);
  s.use_sequence(1);
  refused([&] { s.cut_window(1); }, "no verify window");
  s.use_sequence(2);
  s.cut_window(1);
  EXPECT_EQ(s.position(), 1);
  // A session whose windows take one token keeps no states: steps of several sequences only.
  CudaSession rows_only(m.reader, m.weights, {.max_context = 64, .step_rows = 3, .window_rows = 1, .sequences = 3});
  refused([&] { rows_only.decode_window(two); }, "window_rows");
  const std::vector<CudaSession::Row> window = {{0, 5}, {0, 6}, {1, 7}};
  refused([&] { rows_only.decode_rows(window); }, "window_rows");
  const std::vector<CudaSession::Row> three = {{0, 5}, {1, 6}, {2, 7}};
  EXPECT_EQ(rows_only.decode_rows(three, true).greedy.size(), 3u);
}

}  // namespace

#else
TEST(CudaRows, NeedsACudaBuild) { LODE_REQUIRE_GPU(); }
#endif
