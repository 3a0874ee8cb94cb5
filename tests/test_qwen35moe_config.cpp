// The qwen35moe description: config <-> metadata round trip, validation errors, the 35B preset's
// tensor shapes (spec table), recipes, and the byte total of the UD-Q4_K_XL-like synth.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "core/error.h"
#include "model/qwen35moe.h"
#include "model/recipe.h"
#include "model/synth.h"

namespace {

using namespace lode;
using namespace lode::model;

void expect_same(const Qwen35MoeConfig& a, const Qwen35MoeConfig& b) {
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_mtp_layers, b.n_mtp_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rope_dims, b.rope_dims);
  EXPECT_FLOAT_EQ(float(a.rope_theta), float(b.rope_theta));
  EXPECT_EQ(a.rope_sections, b.rope_sections);
  EXPECT_FLOAT_EQ(float(a.rms_eps), float(b.rms_eps));
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.n_experts_used, b.n_experts_used);
  EXPECT_EQ(a.expert_ff, b.expert_ff);
  EXPECT_EQ(a.shared_ff, b.shared_ff);
  EXPECT_EQ(a.ssm_conv_kernel, b.ssm_conv_kernel);
  EXPECT_EQ(a.ssm_state, b.ssm_state);
  EXPECT_EQ(a.ssm_groups, b.ssm_groups);
  EXPECT_EQ(a.ssm_dt_rank, b.ssm_dt_rank);
  EXPECT_EQ(a.ssm_inner, b.ssm_inner);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.context_length, b.context_length);
  EXPECT_EQ(a.is_recurrent, b.is_recurrent);
}

gguf::Metadata metadata_of(const Qwen35MoeConfig& c) {
  gguf::Metadata m("test");
  write_config(c, m);
  // read_config takes the vocabulary size from the token list.
  m.set("tokenizer.ggml.tokens",
        gguf::Value(gguf::Array(std::vector<std::string>(size_t(c.vocab), "t"))));
  return m;
}

TEST(Qwen35MoeConfig, RoundTripsThroughMetadata) {
  for (bool mtp : {false, true}) {
    const Qwen35MoeConfig c = qwen36_35b_a3b_config(mtp);
    const gguf::Metadata m = metadata_of(c);
    EXPECT_EQ(m.get_int64("qwen35moe.block_count"), mtp ? 41 : 40);
    EXPECT_EQ(m.get_int64("qwen35moe.full_attention_interval"), 4);
    expect_same(read_config(m), c);
  }
}

TEST(Qwen35MoeConfig, IrregularLayerPatternUsesTheArray) {
  Qwen35MoeConfig c = synth_config("tiny", 5, false);
  c.is_recurrent = {true, false, true, true, false};  // no interval fits
  const gguf::Metadata m = metadata_of(c);
  ASSERT_TRUE(m.contains("qwen35moe.attention.recurrent_layers"));
  expect_same(read_config(m), c);
  // Without the array, the interval decides.
  gguf::Metadata by_interval = metadata_of(synth_config("tiny", 8, false));
  by_interval.erase("qwen35moe.attention.recurrent_layers");
  by_interval.set("qwen35moe.full_attention_interval", gguf::Value(uint32_t(2)));
  const auto kinds = read_config(by_interval).is_recurrent;
  EXPECT_EQ(kinds, (std::vector<bool>{true, false, true, false, true, false, true, false}));
}

TEST(Qwen35MoeConfig, ValidationNamesTheProblem) {
  const Qwen35MoeConfig good = qwen36_35b_a3b_config(false);
  auto expect_error = [](const gguf::Metadata& m, const std::string& needle) {
    try {
      read_config(m);
      ADD_FAILURE() << "no error, expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  gguf::Metadata m = metadata_of(good);
  m.set("general.architecture", gguf::Value("qwen3moe"));
  expect_error(m, "qwen35moe");
  m = metadata_of(good);
  m.erase("qwen35moe.ssm.group_count");
  expect_error(m, "qwen35moe.ssm.group_count");
  m = metadata_of(good);
  m.set("qwen35moe.ssm.inner_size", gguf::Value(uint32_t(1000)));
  expect_error(m, "inner_size");
  m = metadata_of(good);
  m.set("qwen35moe.ssm.group_count", gguf::Value(uint32_t(5)));
  expect_error(m, "time_step_rank");
  m = metadata_of(good);
  m.set("qwen35moe.attention.head_count_kv", gguf::Value(uint32_t(3)));
  expect_error(m, "head_count_kv");
  m = metadata_of(good);
  m.set("qwen35moe.expert_used_count", gguf::Value(uint32_t(300)));
  expect_error(m, "expert_used_count");
  // Sizes past any real model's are refused before anything is allocated for them (a block_count of
  // 2^62 ran out of memory, one of 2^34 spent a minute), and so are floats the model cannot use.
  m = metadata_of(good);
  m.set("qwen35moe.block_count", gguf::Value(uint64_t(1) << 62));
  expect_error(m, "qwen35moe.block_count = 4611686018427387904 is outside 1..1024");
  m = metadata_of(good);
  m.set("qwen35moe.context_length", gguf::Value(uint64_t(1) << 62));
  expect_error(m, "qwen35moe.context_length");
  for (const float bad : {0.0f, -1.0f, NAN, INFINITY}) {
    m = metadata_of(good);
    m.set("qwen35moe.rope.freq_base", gguf::Value(bad));
    expect_error(m, "qwen35moe.rope.freq_base");
    m = metadata_of(good);
    m.set("qwen35moe.attention.layer_norm_rms_epsilon", gguf::Value(bad));
    expect_error(m, "layer_norm_rms_epsilon");
  }
  m = metadata_of(good);
  m.set("qwen35moe.rope.dimension_sections", gguf::Value(gguf::Array(std::vector<int32_t>{1000000, 0, 0, 0})));
  expect_error(m, "rope.dimension_sections holds 1000000");
  // An array of the wrong type names its key.
  m = metadata_of(good);
  m.set("qwen35moe.attention.recurrent_layers", gguf::Value(gguf::Array(std::vector<std::string>{"a", "b"})));
  expect_error(m, "qwen35moe.attention.recurrent_layers");
  m = metadata_of(good);
  m.set("qwen35moe.rope.dimension_sections", gguf::Value(true));
  expect_error(m, "qwen35moe.rope.dimension_sections");
}

// The shapes of the spec's table, in ggml order.
TEST(Qwen35MoeConfig, TensorSpecsOf35BMatchTheSpec) {
  const Qwen35MoeConfig c = qwen36_35b_a3b_config(true);
  EXPECT_EQ(c.n_full_attention_layers(), 10);
  std::map<std::string, std::vector<int64_t>> shape;
  for (const TensorSpec& s : tensor_specs(c)) {
    EXPECT_TRUE(shape.emplace(s.name, s.ne).second) << "duplicate " << s.name;
    const auto named = role_from_name(s.name);
    ASSERT_TRUE(named) << s.name;
    EXPECT_EQ(named->role, s.role) << s.name;
    EXPECT_EQ(named->block, s.block) << s.name;
  }
  using V = std::vector<int64_t>;
  EXPECT_EQ(shape.at("token_embd.weight"), (V{2048, 248320}));
  EXPECT_EQ(shape.at("output.weight"), (V{2048, 248320}));
  EXPECT_EQ(shape.at("output_norm.weight"), (V{2048}));
  // Block 0: Gated DeltaNet.
  EXPECT_EQ(shape.at("blk.0.attn_qkv.weight"), (V{2048, 8192}));  // Q 2048 | K 2048 | V 4096
  EXPECT_EQ(shape.at("blk.0.attn_gate.weight"), (V{2048, 4096}));
  EXPECT_EQ(shape.at("blk.0.ssm_conv1d.weight"), (V{4, 8192}));
  EXPECT_EQ(shape.at("blk.0.ssm_dt.bias"), (V{32}));
  EXPECT_EQ(shape.at("blk.0.ssm_a"), (V{32}));
  EXPECT_EQ(shape.at("blk.0.ssm_beta.weight"), (V{2048, 32}));
  EXPECT_EQ(shape.at("blk.0.ssm_alpha.weight"), (V{2048, 32}));
  EXPECT_EQ(shape.at("blk.0.ssm_norm.weight"), (V{128}));
  EXPECT_EQ(shape.at("blk.0.ssm_out.weight"), (V{4096, 2048}));
  EXPECT_FALSE(shape.contains("blk.0.attn_q.weight"));
  // Block 3: full attention.
  EXPECT_EQ(shape.at("blk.3.attn_q.weight"), (V{2048, 8192}));  // 16 heads x (q|gate) x 256
  EXPECT_EQ(shape.at("blk.3.attn_k.weight"), (V{2048, 512}));
  EXPECT_EQ(shape.at("blk.3.attn_v.weight"), (V{2048, 512}));
  EXPECT_EQ(shape.at("blk.3.attn_output.weight"), (V{4096, 2048}));
  EXPECT_EQ(shape.at("blk.3.attn_q_norm.weight"), (V{256}));
  EXPECT_EQ(shape.at("blk.3.attn_k_norm.weight"), (V{256}));
  EXPECT_FALSE(shape.contains("blk.3.attn_qkv.weight"));
  // MoE, every block.
  EXPECT_EQ(shape.at("blk.39.ffn_gate_inp.weight"), (V{2048, 256}));
  EXPECT_EQ(shape.at("blk.39.ffn_gate_exps.weight"), (V{2048, 512, 256}));
  EXPECT_EQ(shape.at("blk.39.ffn_up_exps.weight"), (V{2048, 512, 256}));
  EXPECT_EQ(shape.at("blk.39.ffn_down_exps.weight"), (V{512, 2048, 256}));
  EXPECT_EQ(shape.at("blk.39.ffn_gate_inp_shexp.weight"), (V{2048}));
  EXPECT_EQ(shape.at("blk.39.ffn_gate_shexp.weight"), (V{2048, 512}));
  EXPECT_EQ(shape.at("blk.39.ffn_down_shexp.weight"), (V{512, 2048}));
  // MTP block 40: full attention + MoE + nextn.
  EXPECT_EQ(shape.at("blk.40.attn_q.weight"), (V{2048, 8192}));
  EXPECT_EQ(shape.at("blk.40.nextn.eh_proj.weight"), (V{4096, 2048}));
  EXPECT_EQ(shape.at("blk.40.nextn.enorm.weight"), (V{2048}));
  EXPECT_EQ(shape.at("blk.40.nextn.hnorm.weight"), (V{2048}));
  EXPECT_EQ(shape.at("blk.40.nextn.shared_head_norm.weight"), (V{2048}));
  EXPECT_EQ(shape.at("blk.40.ffn_down_exps.weight"), (V{512, 2048, 256}));
  EXPECT_FALSE(shape.contains("blk.41.attn_norm.weight"));
}

TEST(Qwen35MoeConfig, UdQ4KXlOf35BIsAbout21GB) {
  const Qwen35MoeConfig c = qwen36_35b_a3b_config(true);
  for (const Recipe& r : all_recipes())
    std::printf("35B+MTP tensors as %-10s %6.2f GB\n", r.name.c_str(),
                double(synth_tensor_bytes(c, r)) / 1e9);
  const uint64_t bytes = synth_tensor_bytes(c, find_recipe("ud-q4_k_xl"));
  EXPECT_GT(bytes, 20'000'000'000ull);
  EXPECT_LT(bytes, 23'000'000'000ull);
  // Q8_0 is ~35 GB (the spec's published size), F16 ~2 bytes per parameter.
  const uint64_t q8 = synth_tensor_bytes(c, find_recipe("q8_0"));
  EXPECT_GT(q8, 35'000'000'000ull);
  EXPECT_LT(q8, 38'500'000'000ull);
}

TEST(Recipe, UdQ4KXlPicksThePerRoleTypes) {
  const Recipe& r = find_recipe("UD_Q4_K_XL");
  auto type_of = [&](TensorRole role, std::vector<int64_t> ne) {
    return recipe_type(r, TensorSpec{"x", std::move(ne), role, 3}, 41);
  };
  EXPECT_EQ(type_of(TensorRole::expert_gate, {2048, 512, 256}), GgmlType::Q4_K);
  EXPECT_EQ(type_of(TensorRole::expert_up, {2048, 512, 256}), GgmlType::Q4_K);
  EXPECT_EQ(type_of(TensorRole::expert_down, {512, 2048, 256}), GgmlType::Q5_K);
  EXPECT_EQ(type_of(TensorRole::ssm_qkv, {2048, 8192}), GgmlType::Q8_0);
  EXPECT_EQ(type_of(TensorRole::attn_q, {2048, 8192}), GgmlType::Q8_0);
  EXPECT_EQ(type_of(TensorRole::embedding, {2048, 248320}), GgmlType::Q6_K);
  EXPECT_EQ(type_of(TensorRole::output, {2048, 248320}), GgmlType::Q6_K);
  for (TensorRole role : {TensorRole::router, TensorRole::ssm_conv, TensorRole::norm})
    EXPECT_EQ(type_of(role, {2048, 256}), GgmlType::F32) << role_name(role);
  EXPECT_EQ(type_of(TensorRole::ssm_a, {32}), GgmlType::F32);
  // A row that is not whole Q5_K blocks falls back to a 32-block type.
  EXPECT_EQ(type_of(TensorRole::expert_down, {96, 2048, 8}), GgmlType::Q5_0);
  EXPECT_THROW(find_recipe("q3_nope"), Error);
}

TEST(Recipe, RoleFromName) {
  EXPECT_EQ(role_from_name("blk.12.ffn_down_exps.weight")->role, TensorRole::expert_down);
  EXPECT_EQ(role_from_name("blk.12.ffn_down_exps.weight")->block, 12);
  EXPECT_EQ(role_from_name("token_embd.weight")->block, -1);
  EXPECT_EQ(role_from_name("blk.0.ssm_a")->role, TensorRole::ssm_a);
  EXPECT_FALSE(role_from_name("blk.x.ssm_a"));
  EXPECT_FALSE(role_from_name("blk.0.token_embd.weight"));
  EXPECT_FALSE(role_from_name("rope_freqs.weight"));
}

}  // namespace
