// engine::perplexity and `lode ppl` on a synthesized tiny model (random weights, the synth
// byte-level vocabulary): the result equals a hand computation from whole-window logits, windows
// are independent, the chunk size does not matter, --max-windows limits the work, bad input fails
// clearly, and the command line prints the library's numbers; on the GPU (`--backend cuda`) the
// command gives lode-mini's perplexity as the CPU engine does, within the GPU's float steps.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <regex>

#include "cpu/engine.h"
#include "engine/perplexity.h"
#include "model/synth.h"
#include "support/gpu.h"
#include "support/paths.h"
#include "support/run_lode.h"
#include "test_gguf_helpers.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace lode;

class Perplexity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    model::SynthOptions o;
    o.layers = 2;
    o.seed = 23;
    o.recipe = "q8_0";
    model::write_synth(model_path(), o);
    reader_ = new gguf::Reader(model_path());
  }
  static void TearDownTestSuite() {
    delete reader_;
    delete dir_;
  }
  static std::filesystem::path model_path() { return *dir_ / "tiny.gguf"; }
  // deltanet_chunk 0 makes every chunking of a prompt bit-identical (see cpu/session.h).
  static cpu::Session session(int64_t deltanet_chunk = 0) {
    return cpu::Session(*reader_, model::read_config(reader_->metadata()),
                        {.threads = 1, .deltanet_chunk = deltanet_chunk});
  }
  static std::vector<int32_t> random_tokens(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> id(0, 1023);  // the tiny preset's vocabulary
    std::vector<int32_t> tokens(n);
    for (auto& t : tokens) t = id(rng);
    return tokens;
  }
  // Sum of -log p(window[i] | window[0, i)) for i >= 1, from one all-logits prefill of the whole
  // window on a fresh session; log-softmax by log-sum-exp in long double.
  static double hand_nll_sum(std::span<const int32_t> window) {
    cpu::Session s = session();
    const std::vector<float> logits = s.prefill(window, 0, true);
    const size_t vocab = size_t(s.vocab());
    long double sum = 0;
    for (size_t i = 1; i < window.size(); ++i) {
      const float* row = logits.data() + (i - 1) * vocab;
      long double max = row[0], z = 0;
      for (size_t v = 0; v < vocab; ++v) max = std::max<long double>(max, row[v]);
      for (size_t v = 0; v < vocab; ++v) z += std::exp(static_cast<long double>(row[v]) - max);
      sum += std::log(z) + max - row[size_t(window[i])];
    }
    return double(sum);
  }
  static engine::PerplexityResult run(std::span<const int32_t> tokens, engine::PerplexityOptions o,
                                      int64_t deltanet_chunk = 0) {
    cpu::Session s = session(deltanet_chunk);
    return engine::perplexity(*cpu::borrow_sequence(s), tokens, o);
  }

  static inline test::TempDir* dir_ = nullptr;
  static inline gguf::Reader* reader_ = nullptr;
};

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

TEST_F(Perplexity, EqualsTheHandComputationOverEachWindow) {
  // 40 tokens at ctx 16: windows of 16, 16 and 8; chunk 5 cuts each window unevenly.
  const auto tokens = random_tokens(40, 1);
  const std::span<const int32_t> all(tokens);
  const double expect = hand_nll_sum(all.subspan(0, 16)) + hand_nll_sum(all.subspan(16, 16)) +
                        hand_nll_sum(all.subspan(32, 8));
  const auto r = run(tokens, {.ctx = 16, .chunk = 5});
  EXPECT_EQ(r.windows, 3);
  EXPECT_EQ(r.scored, 15 + 15 + 7);
  EXPECT_EQ(r.evaluated_tokens(), 40);
  EXPECT_LT(relative(r.nll_sum, expect), 1e-9) << r.nll_sum << " vs " << expect;
  EXPECT_LT(relative(r.mean_nll(), expect / 37), 1e-9);
  EXPECT_LT(relative(r.perplexity(), std::exp(expect / 37)), 1e-9);
  // Random weights: near the uniform log(1024) = 6.93 nats, but not exactly.
  EXPECT_GT(r.mean_nll(), 3.0);
  EXPECT_LT(r.mean_nll(), 12.0);
  EXPECT_GE(r.seconds, 0.0);
}

TEST_F(Perplexity, WindowsAreIndependentAndCombineBySum) {
  const auto tokens = random_tokens(32, 2);
  const std::span<const int32_t> all(tokens);
  const auto both = run(tokens, {.ctx = 16, .chunk = 16});
  const auto first = run(all.subspan(0, 16), {.ctx = 16, .chunk = 16});
  const auto second = run(all.subspan(16, 16), {.ctx = 16, .chunk = 16});
  EXPECT_EQ(both.windows, 2);
  EXPECT_EQ(both.scored, first.scored + second.scored);
  EXPECT_LT(relative(both.nll_sum, first.nll_sum + second.nll_sum), 1e-12);
  // The second window really is cut off from the first: scored with that context it differs.
  const double with_context = hand_nll_sum(all) - hand_nll_sum(all.subspan(0, 16));
  EXPECT_GT(relative(second.nll_sum, with_context), 1e-6);

  // A session that already holds a sequence is reset before the first window.
  cpu::Session s = session();
  s.prefill(random_tokens(9, 3));
  const auto after_other = engine::perplexity(*cpu::borrow_sequence(s), tokens, {.ctx = 16, .chunk = 16});
  EXPECT_LT(relative(after_other.nll_sum, both.nll_sum), 1e-12);
  EXPECT_EQ(s.position(), 16);
}

TEST_F(Perplexity, AOneTokenRemainderIsDroppedATwoTokenOneKept) {
  const auto tokens = random_tokens(34, 4);
  const std::span<const int32_t> all(tokens);
  const auto r33 = run(all.subspan(0, 33), {.ctx = 16});
  const auto r32 = run(all.subspan(0, 32), {.ctx = 16});
  EXPECT_EQ(r33.windows, 2);
  EXPECT_EQ(r33.scored, 30);
  EXPECT_EQ(r33.nll_sum, r32.nll_sum);
  const auto r34 = run(tokens, {.ctx = 16});
  EXPECT_EQ(r34.windows, 3);
  EXPECT_EQ(r34.scored, 31);
  EXPECT_LT(relative(r34.nll_sum - r32.nll_sum, hand_nll_sum(all.subspan(32, 2))), 1e-9);
  EXPECT_EQ(engine::perplexity_windows(33, 16), 2);
  EXPECT_EQ(engine::perplexity_windows(34, 16), 3);
  EXPECT_EQ(engine::perplexity_windows(1, 16), 0);
}

TEST_F(Perplexity, ChunkSizeDoesNotChangeTheResult) {
  // The session's default chunked DeltaNet form: chunkings agree up to rounding.
  const auto tokens = random_tokens(80, 5);
  const auto whole = run(tokens, {.ctx = 40, .chunk = 64}, 64);
  for (int64_t chunk : {1, 7, 16, 39}) {
    const auto r = run(tokens, {.ctx = 40, .chunk = chunk}, 64);
    EXPECT_EQ(r.scored, whole.scored);
    EXPECT_LT(relative(r.nll_sum, whole.nll_sum), 1e-6) << "chunk " << chunk;
  }
}

TEST_F(Perplexity, MaxWindowsLimitsTheWorkAndTheSinkSeesEachWindow) {
  const auto tokens = random_tokens(5 * 12, 6);
  std::vector<std::pair<int64_t, int64_t>> calls;
  std::vector<double> nll_so_far;
  cpu::Session s = session();
  const auto r = engine::perplexity(*cpu::borrow_sequence(s), tokens, {.ctx = 12, .chunk = 4, .max_windows = 2},
                                    [&](int64_t w, int64_t n, const engine::PerplexityResult& so_far) {
                                      calls.emplace_back(w, n);
                                      nll_so_far.push_back(so_far.nll_sum);
                                      EXPECT_EQ(so_far.windows, w);
                                    });
  EXPECT_EQ(r.windows, 2);
  EXPECT_EQ(r.scored, 22);
  EXPECT_EQ(calls, (std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {2, 2}}));
  ASSERT_EQ(nll_so_far.size(), 2u);
  EXPECT_EQ(nll_so_far[1], r.nll_sum);
  const auto first_two = run(std::span<const int32_t>(tokens).subspan(0, 24), {.ctx = 12, .chunk = 4});
  EXPECT_EQ(r.nll_sum, first_two.nll_sum);
  EXPECT_EQ(run(tokens, {.ctx = 12, .max_windows = 9}).windows, 5);  // more than there are: all
}

TEST_F(Perplexity, BadInputFailsClearly) {
  cpu::Session s = session();
  const auto tokens = random_tokens(20, 7);
  EXPECT_TRUE(test::fails_with([&] { engine::perplexity(*cpu::borrow_sequence(s), tokens, {.ctx = 1}); }, {"--ctx 1", "at least 2"}));
  const std::vector<int32_t> one{42};
  EXPECT_TRUE(test::fails_with([&] { engine::perplexity(*cpu::borrow_sequence(s), one, {.ctx = 16}); }, {"1 token", "at least 2"}));
  EXPECT_TRUE(test::fails_with([&] { engine::perplexity(*cpu::borrow_sequence(s), {}, {.ctx = 16}); }, {"0 token"}));
  EXPECT_TRUE(test::fails_with([&] { engine::perplexity(*cpu::borrow_sequence(s), tokens, {.ctx = 4097}); },
                               {"--ctx 4097", "context length of 4096"}));
  EXPECT_TRUE(test::fails_with([&] { engine::perplexity(*cpu::borrow_sequence(s), tokens, {.ctx = 8, .chunk = 0}); }, {"--chunk 0"}));
}

TEST(PerplexityMath, TokenNllIsTheNegativeLogSoftmax) {
  const std::vector<float> uniform(1000, 3.5f);
  EXPECT_NEAR(engine::token_nll(uniform, 17), std::log(1000.0), 1e-12);
  // Large logits must not overflow: log(1 + e^-1) for the larger of two.
  const std::vector<float> two{1000.0f, 999.0f};
  EXPECT_NEAR(engine::token_nll(two, 0), std::log1p(std::exp(-1.0)), 1e-12);
  EXPECT_NEAR(engine::token_nll(two, 1), 1.0 + std::log1p(std::exp(-1.0)), 1e-12);
  EXPECT_TRUE(test::fails_with([&] { engine::token_nll(two, 2); }, {"token id 2"}));
}

TEST(PerplexityMath, DerivedNumbers) {
  engine::PerplexityResult r{.nll_sum = 20.0, .scored = 10, .windows = 2, .text_bytes = 40};
  EXPECT_DOUBLE_EQ(r.mean_nll(), 2.0);
  EXPECT_DOUBLE_EQ(r.perplexity(), std::exp(2.0));
  EXPECT_DOUBLE_EQ(r.bits_per_byte(), 20.0 / std::log(2.0) / 40.0);
  EXPECT_EQ(r.evaluated_tokens(), 12);
  EXPECT_TRUE(std::isnan(engine::PerplexityResult{}.perplexity()));
}

TEST_F(Perplexity, CliPrintsTheLibrarysNumbers) {
  std::string text;
  for (int i = 0; i < 6; ++i)
    text += "The quick brown fox jumps over the lazy dog, then rests by the river bank. ";
  const test::TempDir scratch;
  std::ofstream(scratch / "in.txt", std::ios::binary) << text;

  const auto tok = tokenizer::Tokenizer::from_metadata(reader_->metadata());
  const auto tokens = tok.encode(text, false);
  cpu::Session s(*reader_, model::read_config(reader_->metadata()), {.threads = 1});
  const auto lib = engine::perplexity(*cpu::borrow_sequence(s), tokens, {.ctx = 32, .chunk = 64});
  ASSERT_GE(lib.windows, 3);

  const auto r = test::run_lode("ppl -m '" + model_path().string() + "' -f '" + (scratch / "in.txt").string() +
                                    "' --ctx 32 --threads 1 --backend cpu",
                                scratch.path());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::regex line(R"(perplexity: ([0-9.]+) over (\d+) tokens in (\d+) windows of 32 \(mean NLL ([0-9.]+) nats/token, ([0-9.]+) bits/byte\))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, line)) << r.out;
  EXPECT_NEAR(std::stod(m[1]), lib.perplexity(), 1e-4 * lib.perplexity());
  EXPECT_EQ(std::stoll(m[2]), lib.scored);
  EXPECT_EQ(std::stoll(m[3]), lib.windows);
  EXPECT_NEAR(std::stod(m[4]), lib.mean_nll(), 1e-4);
  EXPECT_NEAR(std::stod(m[5]), lib.nll_sum / std::log(2.0) / double(text.size()), 1e-4);
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(speed: [0-9.]+ tokens/s \([0-9.]+ s\))"))) << r.out;
  EXPECT_NE(r.err.find("[" + std::to_string(lib.windows) + "/" + std::to_string(lib.windows) + "] ppl so far"),
            std::string::npos) << r.err;

  const auto bad = test::run_lode("ppl -m '" + model_path().string() + "' -f '" + (scratch / "in.txt").string() +
                                      "' --ctx 1",
                                  scratch.path());
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--ctx 1"), std::string::npos) << bad.err;
}

// `lode ppl`'s numbers from a line of its output: mean NLL and windows.
struct PplLine {
  double mean_nll = 0;
  int64_t scored = 0, windows = 0;
};
PplLine parse_ppl(const std::string& out) {
  const std::regex line(R"(perplexity: [0-9.]+ over (\d+) tokens in (\d+) windows of \d+ \(mean NLL ([0-9.]+) nats/token)");
  std::smatch m;
  if (!std::regex_search(out, m, line)) return {};
  return {.mean_nll = std::stod(m[3]), .scored = std::stoll(m[1]), .windows = std::stoll(m[2])};
}

// Without a GPU, --backend cuda is refused, saying why, rather than run on the CPU.
TEST_F(Perplexity, CliOnTheGpuWithoutOneFailsClearly) {
  std::string why;
  if (test::gpu_available(&why)) GTEST_SKIP() << "a GPU is here: Perplexity.CliOnTheGpuGivesTheCpusFigure runs it";
  const test::TempDir scratch;
  std::ofstream(scratch / "in.txt", std::ios::binary) << "The quick brown fox jumps over the lazy dog again and again.";
  const auto r = test::run_lode("ppl -m '" + model_path().string() + "' -f '" + (scratch / "in.txt").string() +
                                    "' --ctx 16 --backend cuda",
                                scratch.path());
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(r.err.find("CUDA") != std::string::npos || r.err.find("GPU") != std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("perplexity:"), std::string::npos) << r.out;
}

// lode-mini over held-out text in windows of 256 on both engines. The GPU's prompt products run
// in TF32 (a logit vector within about 2e-4 of the CPU's, tests/test_cuda_forward.cpp); a token's
// NLL moves by about the error of its logits, so the mean over a thousand tokens within 0.01 nats
// of the CPU's. A window that kept the one before it, or logits a position off, moves lode-mini's
// mean by tenths of a nat or more.
TEST_F(Perplexity, CliOnTheGpuGivesTheCpusFigure) {
  LODE_REQUIRE_GPU();
  const std::string args = "ppl -m '" + test::mini_model_path().string() + "' -f '" +
                           (test::test_data() / "mini/heldout_sample.txt").string() +
                           "' --ctx 256 --max-windows 4 --chunk 128 --backend ";
  const test::TempDir scratch;
  const auto cpu = test::run_lode(args + "cpu", scratch.path());
  const auto gpu = test::run_lode(args + "cuda", scratch.path());
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  ASSERT_EQ(gpu.status, 0) << gpu.err;
  const PplLine want = parse_ppl(cpu.out), got = parse_ppl(gpu.out);
  ASSERT_EQ(want.windows, 4) << cpu.out;
  EXPECT_EQ(got.windows, want.windows) << gpu.out;
  EXPECT_EQ(got.scored, want.scored) << gpu.out;
  std::printf("[ cuda ] lode-mini mean NLL: GPU %.5f, CPU %.5f\n", got.mean_nll, want.mean_nll);
  EXPECT_NEAR(got.mean_nll, want.mean_nll, 0.01);
}

}  // namespace
