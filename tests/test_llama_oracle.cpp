// llama.cpp as a logits oracle (tools/oracle/llama_logits.c, run through tools/oracle/llama_run) on
// a tiny random qwen35moe GGUF written here with lode's writer (F32), and on `lode synth --preset
// tiny` (quantized recipe): llama.cpp loads them, the logits are finite, identical across runs,
// and --greedy agrees with the argmax of the logits of the continued prompt.
// Skips when the npm build of llama.cpp has not been fetched (tools/oracle/fetch).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "gguf/writer.h"
#include "model/qwen35moe.h"
#include "support/fixtures.h"
#include "support/llama_oracle.h"
#include "support/run_lode.h"

namespace {

namespace fs = std::filesystem;
using lode::model::TensorRole;

using lode::test::argmax;
using lode::test::GreedyStep;
using lode::test::softmax_of;
using lode::test::OracleRun;
using lode::test::kOracleLib;
using lode::test::parse_greedy;
using lode::test::run_oracle;
constexpr int kVocab = 512;

lode::model::Qwen35MoeConfig tiny_config() {
  lode::model::Qwen35MoeConfig c;
  c.hidden = 64;
  c.n_layers = 4;
  c.is_recurrent = {true, true, true, false};  // three DeltaNet layers, one full attention
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.rope_dims = 16;
  c.rope_theta = 1e7;
  c.rope_sections = {3, 3, 2, 0};
  c.rms_eps = 1e-6;
  c.n_experts = 8;
  c.n_experts_used = 2;
  c.expert_ff = 32;
  c.shared_ff = 32;
  c.ssm_conv_kernel = 4;
  c.ssm_state = 16;
  c.ssm_groups = 2;
  c.ssm_dt_rank = 4;  // Hv > Hk
  c.ssm_inner = 4 * 16;
  c.vocab = kVocab;
  c.context_length = 4096;
  return c;
}

// GPT-2's byte-level spelling of one byte, UTF-8 encoded: printable bytes stand for themselves,
// the others for code points from 256 on.
std::string byte_token(int byte) {
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
  int code_point = byte;
  if (!printable(byte)) {
    code_point = 256;
    for (int b = 0; b < byte; ++b) code_point += !printable(b);
  }
  if (code_point < 0x80) return std::string(1, char(code_point));
  return {char(0xC0 | (code_point >> 6)), char(0x80 | (code_point & 0x3F))};
}

// The minimum tokenizer llama.cpp accepts for a gpt2-style vocabulary.
void add_tokenizer(lode::gguf::Writer& writer) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_token(b)), types.push_back(1);
  for (int i = 256; i < kVocab - 1; ++i) tokens.push_back("tok" + std::to_string(i)), types.push_back(1);
  tokens.push_back("<|endoftext|>"), types.push_back(3);  // control
  writer.set("tokenizer.ggml.model", lode::gguf::Value(std::string("gpt2")));
  writer.set("tokenizer.ggml.pre", lode::gguf::Value(std::string("qwen35")));
  writer.set("tokenizer.ggml.tokens", lode::gguf::Value(lode::gguf::Array(tokens)));
  writer.set("tokenizer.ggml.token_type", lode::gguf::Value(lode::gguf::Array(types)));
  writer.set("tokenizer.ggml.merges", lode::gguf::Value(lode::gguf::Array(std::vector<std::string>{"t o"})));
  writer.set("tokenizer.ggml.eos_token_id", lode::gguf::Value(uint32_t(kVocab - 1)));
}

// A random value that keeps the forward pass sane for a tensor of this role.
float random_value(TensorRole role, int64_t row_length, std::mt19937& rng) {
  std::normal_distribution<float> gauss(0.f, 1.f);
  const float fan_in = 1.f / std::sqrt(float(row_length));
  switch (role) {
    case TensorRole::norm: return 1.f + 0.1f * gauss(rng);
    case TensorRole::ssm_a: return -std::exp(0.5f * gauss(rng));  // decay: negative
    case TensorRole::ssm_dt:
    case TensorRole::ssm_conv: return 0.5f * gauss(rng);
    case TensorRole::embedding: return gauss(rng);
    case TensorRole::router: return 2.f * fan_in * gauss(rng);
    default: return fan_in * gauss(rng);
  }
}

void write_tiny_model(const fs::path& path) {
  const auto config = tiny_config();
  lode::gguf::Writer writer;
  lode::model::write_config(config, writer.metadata());
  add_tokenizer(writer);
  std::mt19937 rng(1234);
  for (const auto& spec : lode::model::tensor_specs(config)) {
    int64_t n = 1;
    for (int64_t d : spec.ne) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    for (float& v : values) v = random_value(spec.role, spec.ne[0], rng);
    writer.add_tensor(spec.name, lode::GgmlType::F32, std::span<const int64_t>(spec.ne),
                      [values](std::span<uint8_t> out) { std::memcpy(out.data(), values.data(), out.size()); });
  }
  writer.write(path);
}

double relative_l2(const float* a, const float* b, size_t n) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), norm += double(a[i]) * a[i];
  return std::sqrt(diff / norm);
}

bool all_finite(const std::vector<float>& values) {
  return std::all_of(values.begin(), values.end(), [](float x) { return std::isfinite(x); });
}

// Runs the oracle on `model` twice with --greedy and once over prompt + continuation in one batch,
// and checks: finite logits, identical runs, the printed top-1/top-2 match the logits, each greedy
// token is the argmax of its batch row (unless a near-tie), one-token-decode rows (--greedy-logits)
// agree with the batch rows to float32 noise (measured ~1e-5). n_vocab comes from the output size.
void check_oracle(const fs::path& model, const std::vector<int>& prompt, int n_greedy, const fs::path& scratch) {
  const int n = int(prompt.size());
  const fs::path greedy_rows = scratch / "greedy.f32";
  const std::string extra = "--threads 1 --greedy " + std::to_string(n_greedy) + " --greedy-logits '" +
                            greedy_rows.string() + "'";
  const OracleRun first = run_oracle(model, prompt, extra, scratch, "a.f32");
  ASSERT_EQ(first.result.status, 0) << first.result.err;
  ASSERT_FALSE(first.logits.empty());
  ASSERT_EQ(first.logits.size() % size_t(n), 0u);
  const int n_vocab = int(first.logits.size() / size_t(n));
  EXPECT_TRUE(all_finite(first.logits));
  EXPECT_NE(*std::min_element(first.logits.begin(), first.logits.end()),
            *std::max_element(first.logits.begin(), first.logits.end()));
  const std::vector<float> rows = lode::test::read_floats(greedy_rows);

  // Deterministic: the same run again gives the same bytes and the same continuation.
  const OracleRun second = run_oracle(model, prompt, extra, scratch, "b.f32");
  ASSERT_EQ(second.result.status, 0) << second.result.err;
  EXPECT_EQ(first.logits, second.logits);
  EXPECT_EQ(first.result.out, second.result.out);

  std::vector<int> ids;
  const auto steps = parse_greedy(first.result.out, ids);
  ASSERT_EQ(ids.size(), size_t(n_greedy)) << first.result.out;
  ASSERT_EQ(steps.size(), size_t(n_greedy)) << first.result.out;
  const float* last_prompt_row = &first.logits[size_t(n - 1) * n_vocab];
  EXPECT_EQ(steps[0].top1, argmax(last_prompt_row, n_vocab));
  EXPECT_NEAR(steps[0].p1, softmax_of(last_prompt_row, n_vocab, steps[0].top1), 1e-5);
  EXPECT_NEAR(steps[0].p2, softmax_of(last_prompt_row, n_vocab, steps[0].top2), 1e-5);

  // Greedy agrees with the logits of prompt + continuation in one batch: each generated token is
  // the argmax of the row before it (a near-tie may flip between batch and one-by-one decoding).
  std::vector<int> continued = prompt;
  continued.insert(continued.end(), ids.begin(), ids.end() - 1);
  const OracleRun batch = run_oracle(model, continued, "--threads 1", scratch, "c.f32");
  ASSERT_EQ(batch.result.status, 0) << batch.result.err;
  ASSERT_EQ(batch.logits.size(), continued.size() * n_vocab);
  for (int k = 0; k < n_greedy; ++k) {
    EXPECT_EQ(steps[k].top1, ids[k]);
    EXPECT_GE(steps[k].p1, steps[k].p2);
    if (steps[k].p1 - steps[k].p2 < 1e-4) continue;
    EXPECT_EQ(argmax(&batch.logits[size_t(n - 1 + k) * n_vocab], n_vocab), ids[k]) << "step " << k;
  }
  EXPECT_LT(relative_l2(first.logits.data(), batch.logits.data(), size_t(n) * n_vocab), 1e-4);

  // --greedy-logits: the rows the steps chose from. Row 0 is the last prompt row; the one-token
  // decodes after it agree with the batch rows to float32 noise.
  ASSERT_EQ(rows.size(), size_t(n_greedy) * n_vocab);
  EXPECT_TRUE(std::equal(rows.begin(), rows.begin() + n_vocab, last_prompt_row));
  EXPECT_LT(relative_l2(rows.data(), &batch.logits[size_t(n - 1) * n_vocab], rows.size()), 1e-4);
}

class LlamaOracle : public ::testing::Test {
protected:
  void SetUp() override {
    if (!fs::exists(kOracleLib)) GTEST_SKIP() << "llama.cpp's npm build is not fetched: run tools/oracle/fetch";
    scratch_ = fs::temp_directory_path() / ("lode_llama_oracle_" + std::to_string(::getpid()));
    fs::create_directories(scratch_);
  }
  void TearDown() override {
    if (!scratch_.empty()) fs::remove_all(scratch_);
  }
  fs::path scratch_;
  const std::vector<int> prompt_ = {1, 2, 3, 4, 5, 6, 7, 8};
};

TEST_F(LlamaOracle, TinyFloat32ModelLogitsAreFiniteDeterministicAndMatchGreedy) {
  const fs::path model = scratch_ / "tiny_qwen35moe.gguf";
  write_tiny_model(model);
  check_oracle(model, prompt_, 6, scratch_);
  const OracleRun run = run_oracle(model, prompt_, "", scratch_, "d.f32");
  EXPECT_EQ(run.logits.size(), prompt_.size() * kVocab);
}

// The model helper's synthetic model in its default (quantized) recipe: llama.cpp accepts lode's
// files and the oracle behaves the same on quantized weights.
TEST_F(LlamaOracle, SynthTinyModelLogitsAreFiniteDeterministicAndMatchGreedy) {
  const fs::path model = scratch_ / "synth_tiny.gguf";
  const auto synth = lode::test::run_lode("synth -o '" + model.string() + "' --preset tiny --seed 3", scratch_);
  ASSERT_EQ(synth.status, 0) << synth.err;
  check_oracle(model, prompt_, 4, scratch_);
}

TEST_F(LlamaOracle, RejectsTokenPastTheVocabulary) {
  const fs::path model = scratch_ / "tiny_qwen35moe.gguf";
  write_tiny_model(model);
  const OracleRun run = run_oracle(model, {1, 2, kVocab}, "", scratch_, "bad.f32");
  EXPECT_NE(run.result.status, 0);
  EXPECT_NE(run.result.err.find("past the vocabulary"), std::string::npos) << run.result.err;
}

}  // namespace
