// The CPU forward pass on a tiny random qwen35moe written to a GGUF in the test: chunked prefill
// equals token-by-token decoding, quantized (q8_0) weights run and stay close to float32, and bad
// inputs fail cleanly.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cpu/session.h"
#include "gguf/reader.h"
#include "gguf/writer.h"
#include "model/qwen35moe.h"
#include "support/naive_math.h"
#include "test_gguf_helpers.h"

namespace {

using lode::GgmlType;
using lode::cpu::Session;
using lode::model::Qwen35MoeConfig;
using lode::model::TensorRole;
using lode::test::TempDir;

// Both layer kinds (DeltaNet, DeltaNet, DeltaNet, attention, DeltaNet), Hv > Hk, GQA, partial
// RoPE; row lengths multiples of 32 so every matrix can be q8_0.
Qwen35MoeConfig tiny_config() {
  Qwen35MoeConfig c;
  c.hidden = 64;
  c.n_layers = 5;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.rope_dims = 8;
  c.rope_theta = 10000.0;
  c.rope_sections = {2, 1, 1, 0};
  c.rms_eps = 1e-6;
  c.n_experts = 8;
  c.n_experts_used = 3;
  c.expert_ff = 32;
  c.shared_ff = 64;
  c.ssm_conv_kernel = 4;
  c.ssm_state = 16;
  c.ssm_groups = 2;
  c.ssm_dt_rank = 4;
  c.ssm_inner = 4 * 16;
  c.vocab = 97;
  c.context_length = 512;
  c.is_recurrent = {true, true, true, false, true};
  return c;
}

bool stays_f32(TensorRole role) {
  return role == TensorRole::norm || role == TensorRole::router || role == TensorRole::ssm_conv ||
         role == TensorRole::ssm_a || role == TensorRole::ssm_dt ||
         role == TensorRole::shared_gate_inp;
}

// Values of a sane model: norms near 1 (the +1 already folded), ssm_a negative, small dt bias,
// matrices scaled by 1/sqrt(fan-in) so activations stay O(1).
std::vector<float> random_values(const lode::model::TensorSpec& spec, std::mt19937& rng) {
  int64_t n = 1;
  for (int64_t d : spec.ne) n *= d;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    switch (spec.role) {
      // Near 1 for both kinds: the +1 is folded into GGUF norms; ssm_norm is plain (ones-init).
      case TensorRole::norm: x = 1.0f + 0.2f * normal(rng); break;
      case TensorRole::ssm_a: x = -std::exp(0.5f * normal(rng)); break;
      case TensorRole::ssm_dt: x = 0.5f * normal(rng); break;
      case TensorRole::ssm_conv: x = 0.5f * normal(rng); break;
      case TensorRole::embedding: x = normal(rng); break;
      default: x = normal(rng) / std::sqrt(float(spec.ne[0])); break;
    }
  }
  return v;
}

// Writes the tiny model with every matrix in `matrix_type`; returns the path. With
// `stored_type` F32 and matrix_type q8_0, the matrices hold q8_0's values stored as float32.
std::filesystem::path write_tiny_model(const TempDir& dir, const Qwen35MoeConfig& config,
                                       GgmlType matrix_type, const std::string& name,
                                       GgmlType stored_type, uint32_t seed = 7) {
  lode::gguf::Writer writer;
  lode::model::write_config(config, writer.metadata());
  writer.set("qwen35moe.vocab_size", lode::gguf::Value(uint32_t(config.vocab)));
  std::mt19937 rng(seed);
  std::vector<std::vector<uint8_t>> storage;
  for (const auto& spec : lode::model::tensor_specs(config)) {
    std::vector<float> values = random_values(spec, rng);
    const int64_t rows = int64_t(values.size()) / spec.ne[0];
    if (!stays_f32(spec.role) && matrix_type != stored_type) {
      // Round trip through matrix_type, keep the float32 result.
      const auto& q = lode::traits(matrix_type);
      std::vector<uint8_t> row(lode::row_bytes(matrix_type, spec.ne[0]));
      for (int64_t r = 0; r < rows; ++r) {
        q.quantize(values.data() + r * spec.ne[0], row.data(), spec.ne[0]);
        q.dequantize(row.data(), values.data() + r * spec.ne[0], spec.ne[0]);
      }
    }
    const GgmlType type = stays_f32(spec.role) ? GgmlType::F32 : stored_type;
    const auto& traits = lode::traits(type);
    std::vector<uint8_t> bytes(lode::row_bytes(type, spec.ne[0]) * size_t(rows));
    for (int64_t r = 0; r < rows; ++r) {
      traits.quantize(values.data() + r * spec.ne[0],
                      bytes.data() + size_t(r) * lode::row_bytes(type, spec.ne[0]), spec.ne[0]);
    }
    storage.push_back(std::move(bytes));
    writer.add_tensor(spec.name, type, spec.ne, storage.back());
  }
  const auto path = dir / name;
  writer.write(path);
  return path;
}

std::vector<int32_t> prompt(int64_t n, int64_t vocab, uint32_t seed = 3) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, int32_t(vocab - 1));
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t& t : out) t = token(rng);
  return out;
}

class CpuForward : public ::testing::Test {
protected:
  void SetUp() override {
    config_ = tiny_config();
    path_ = write_tiny_model(dir_, config_, GgmlType::F32, "tiny-f32.gguf", GgmlType::F32);
  }
  TempDir dir_;
  Qwen35MoeConfig config_;
  std::filesystem::path path_;
};

TEST_F(CpuForward, ConfigReadsBackFromTheFile) {
  lode::gguf::Reader reader(path_);
  const Qwen35MoeConfig read = lode::model::read_config(reader.metadata());
  EXPECT_EQ(read.vocab, config_.vocab);
  EXPECT_EQ(read.is_recurrent, config_.is_recurrent);
}

TEST_F(CpuForward, ChunkedPrefillEqualsTokenByTokenDecoding) {
  lode::gguf::Reader reader(path_);
  const Qwen35MoeConfig config = lode::model::read_config(reader.metadata());
  const std::vector<int32_t> tokens = prompt(80, config.vocab);

  // Reference: one decode call per token.
  Session reference(reader, config, {.threads = 2});
  std::vector<float> expected;
  for (int32_t token : tokens) {
    const std::vector<float> logits = reference.decode(token);
    ASSERT_EQ(int64_t(logits.size()), config.vocab);
    expected.insert(expected.end(), logits.begin(), logits.end());
  }
  for (float x : expected) ASSERT_TRUE(std::isfinite(x));

  for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(64), int64_t(0)}) {
    // DeltaNet in the chunked (WY) form, the default: equal up to rounding.
    Session session(reader, config, {.threads = 2});
    const std::vector<float> all = session.prefill(tokens, chunk, true);
    EXPECT_LE(lode::test::relative_error(all, expected), 1e-5) << "chunk " << chunk;
    EXPECT_EQ(session.position(), int64_t(tokens.size()));
    // DeltaNet token by token: bit-identical.
    Session recurrent(reader, config, {.threads = 1, .deltanet_chunk = 0});
    EXPECT_EQ(recurrent.prefill(tokens, chunk, true), expected) << "chunk " << chunk;
  }
  // The last position's logits alone, and decoding on after a prefill.
  Session session(reader, config, {.threads = 1});
  const std::vector<float> last = session.prefill(std::span(tokens).first(60), 7);
  const std::vector<float> expected_59(expected.begin() + 59 * config.vocab,
                                       expected.begin() + 60 * config.vocab);
  EXPECT_LE(lode::test::relative_error(last, expected_59), 1e-5);
  for (size_t i = 60; i < tokens.size(); ++i) {
    const std::vector<float> next = session.decode(tokens[i]);
    const std::vector<float> want(expected.begin() + int64_t(i) * config.vocab,
                                  expected.begin() + int64_t(i + 1) * config.vocab);
    EXPECT_LE(lode::test::relative_error(next, want), 1e-5) << "position " << i;
  }
}

TEST_F(CpuForward, ResetStartsTheSequenceAgain) {
  lode::gguf::Reader reader(path_);
  Session session(reader, config_);
  const std::vector<int32_t> tokens = prompt(12, config_.vocab);
  const std::vector<float> first = session.prefill(tokens);
  session.prefill(prompt(5, config_.vocab, 9));
  session.reset();
  EXPECT_EQ(session.position(), 0);
  EXPECT_EQ(session.prefill(tokens), first);
}

// Sequences stepped together give, bit for bit, what each gives alone with the same chunks: a
// prefill chunk with all its logits, a decode step, and a mid-prompt chunk with none.
TEST_F(CpuForward, BatchedSequencesEqualTheirSoloRuns) {
  lode::gguf::Reader reader(path_);
  const Qwen35MoeConfig config = lode::model::read_config(reader.metadata());
  auto weights = std::make_shared<const lode::model::ModelWeights>(lode::model::bind_weights(reader, config));
  const auto a = prompt(9, config.vocab, 1), b = prompt(4, config.vocab, 2), c = prompt(70, config.vocab, 3);
  Session sa(weights, {.threads = 2}), sb(weights, {.threads = 2}), sc(weights, {.threads = 2});
  sb.prefill(std::span(b).first(3));
  sc.prefill(std::span(c).first(64), 64);
  std::vector<lode::cpu::BatchEntry> batch = {{&sa, a, 9, {}}, {&sb, std::span(b).subspan(3), 1, {}},
                                              {&sc, std::span(c).subspan(64), 0, {}}};
  Session::forward_batch(batch);
  Session solo(weights, {.threads = 2});
  EXPECT_EQ(batch[0].logits, solo.prefill(a, 9, true));
  solo.reset();
  solo.prefill(std::span(b).first(3));
  EXPECT_EQ(batch[1].logits, solo.decode(b[3]));
  EXPECT_TRUE(batch[2].logits.empty());
  EXPECT_EQ(sc.position(), 70);
  solo.reset();
  solo.prefill(c, 64);
  EXPECT_EQ(sc.decode(5), solo.decode(5));
  // Refused without changing anything: a session twice, a token outside the vocabulary.
  std::vector<lode::cpu::BatchEntry> twice = {{&sa, a, 1, {}}, {&sa, a, 1, {}}};
  EXPECT_THROW(Session::forward_batch(twice), lode::Error);
  const std::vector<int32_t> bad = {int32_t(config.vocab)};
  std::vector<lode::cpu::BatchEntry> outside = {{&sb, a, 1, {}}, {&sc, bad, 1, {}}};
  EXPECT_THROW(Session::forward_batch(outside), lode::Error);
  EXPECT_EQ(sa.position(), 9);
  EXPECT_EQ(sb.position(), 4);
}

// A q8_0 model computes what the same model with q8_0's values stored as float32 computes.
TEST_F(CpuForward, Q8_0WeightsGiveTheirFloat32Values) {
  const auto q8_path =
      write_tiny_model(dir_, config_, GgmlType::Q8_0, "tiny-q8_0.gguf", GgmlType::Q8_0);
  const auto f32_path =
      write_tiny_model(dir_, config_, GgmlType::Q8_0, "tiny-q8_0-as-f32.gguf", GgmlType::F32);
  lode::gguf::Reader f32_reader(f32_path), q8_reader(q8_path), original_reader(path_);
  EXPECT_EQ(q8_reader.tensor("blk.0.attn_qkv.weight").ggml_type(), GgmlType::Q8_0);
  EXPECT_EQ(q8_reader.tensor("blk.3.ffn_down_exps.weight").ggml_type(), GgmlType::Q8_0);
  const std::vector<int32_t> tokens = prompt(24, config_.vocab);
  Session f32(f32_reader, config_), q8(q8_reader, config_);
  const std::vector<float> a = f32.prefill(tokens, 16, true);
  const std::vector<float> b = q8.prefill(tokens, 16, true);
  for (float x : b) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LE(lode::test::relative_error(b, a), 1e-6);
  // ... and differs from the unquantized model: the weights really were quantized.
  Session original(original_reader, config_);
  EXPECT_GT(lode::test::relative_error(b, original.prefill(tokens, 16, true)), 1e-4);
  // Chunking stays exact with quantized weights too.
  Session q8_decode(q8_reader, config_);
  std::vector<float> stepwise;
  for (int32_t t : tokens) {
    const auto l = q8_decode.decode(t);
    stepwise.insert(stepwise.end(), l.begin(), l.end());
  }
  EXPECT_LE(lode::test::relative_error(stepwise, b), 1e-5);
}

TEST_F(CpuForward, BadInputsFailClearly) {
  lode::gguf::Reader reader(path_);
  Session session(reader, config_, {.max_context = 10});
  EXPECT_THROW(session.decode(int32_t(config_.vocab)), lode::Error);
  EXPECT_THROW(session.decode(-1), lode::Error);
  EXPECT_THROW(session.prefill(std::vector<int32_t>{}), lode::Error);
  EXPECT_THROW(session.prefill(prompt(11, config_.vocab)), lode::Error);
  EXPECT_EQ(session.position(), 0);
  session.prefill(prompt(10, config_.vocab));
  EXPECT_THROW(session.decode(1), lode::Error);
}

TEST_F(CpuForward, WrongShapeIsRefusedNamingTheTensor) {
  lode::gguf::Reader reader(path_);
  Qwen35MoeConfig wrong = config_;
  wrong.expert_ff = 64;
  try {
    Session session(reader, wrong);
    FAIL() << "binding should fail";
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("ffn_gate_exps"), std::string::npos) << e.what();
  }
}

}  // namespace
