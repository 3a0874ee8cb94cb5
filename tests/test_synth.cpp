// lode synth: the tiny preset writes a file lode reads back with every tensor of tensor_specs in
// the recipe's types, the config round-trips, the values are sane (norms near 1, ssm_a < 0, all
// finite), the vocabulary is consistent, the output is deterministic, and --route-skew skews
// routing the documented way (docs/SYNTH.md).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <set>
#include <string>

#include "core/quant/types.h"
#include "gguf/reader.h"
#include "gguf/writer.h"
#include "model/qwen35moe.h"
#include "model/recipe.h"
#include "model/synth.h"
#include "model/weights.h"
#include "support/run_lode.h"
#include "test_gguf_helpers.h"

namespace {

using namespace lode;
using namespace lode::model;

std::vector<float> dequantize(const gguf::TensorInfo& t) {
  std::vector<float> out(size_t(t.n_elements()));
  t.type->dequantize(t.data, out.data(), t.n_elements());
  return out;
}

TEST(Synth, TinyHasEveryTensorInTheRecipesTypes) {
  const test::TempDir dir;
  SynthOptions o;
  o.preset = "tiny";
  o.mtp = true;
  o.recipe = "ud-q4_k_xl";
  const auto files = write_synth(dir / "tiny.gguf", o);
  ASSERT_EQ(files.size(), 1u);
  const gguf::Reader in(files[0]);

  const Qwen35MoeConfig want = synth_config("tiny", 0, true);
  const Qwen35MoeConfig got = read_config(in.metadata());
  EXPECT_EQ(got.n_layers, want.n_layers);
  EXPECT_EQ(got.n_mtp_layers, 1);
  EXPECT_EQ(got.is_recurrent, want.is_recurrent);
  EXPECT_EQ(got.vocab, want.vocab);
  EXPECT_GT(got.ssm_dt_rank, got.ssm_groups);  // Hv > Hk
  EXPECT_TRUE(std::count(got.is_recurrent.begin(), got.is_recurrent.end(), true) > 0);
  EXPECT_TRUE(std::count(got.is_recurrent.begin(), got.is_recurrent.end(), false) > 0);

  const auto plan = synth_plan(want, find_recipe(o.recipe));
  ASSERT_EQ(in.tensors().size(), plan.size());
  for (const SynthTensor& p : plan) {
    const gguf::TensorInfo* t = in.find_tensor(p.spec.name);
    ASSERT_TRUE(t) << p.spec.name;
    EXPECT_EQ(t->ggml_type(), p.type) << p.spec.name;
    ASSERT_EQ(size_t(t->n_dims), p.spec.ne.size()) << p.spec.name;
    for (size_t d = 0; d < p.spec.ne.size(); ++d) EXPECT_EQ(t->ne[d], p.spec.ne[d]) << p.spec.name;
    const auto values = dequantize(*t);
    for (float v : values) ASSERT_TRUE(std::isfinite(v)) << p.spec.name;
    if (p.spec.role == TensorRole::norm)
      for (float v : values) ASSERT_NEAR(v, 1.0f, 0.35f) << p.spec.name;
    if (p.spec.role == TensorRole::ssm_a)
      for (float v : values) ASSERT_LT(v, 0.0f) << p.spec.name;
  }
  EXPECT_EQ(in.tensor("blk.0.ffn_gate_exps.weight").ggml_type(), GgmlType::Q4_K);
  EXPECT_EQ(in.tensor("blk.0.ffn_down_exps.weight").ggml_type(), GgmlType::Q5_K);
  EXPECT_EQ(in.tensor("blk.4.nextn.eh_proj.weight").ggml_type(), GgmlType::Q8_0);
  EXPECT_EQ(in.metadata().get_string("tokenizer.ggml.pre"), "qwen35");
}

TEST(Synth, SmallVocabularyIsConsistent) {
  gguf::Metadata m;
  write_synth_vocab(1024, m);
  const auto& tokens = m.get_array("tokenizer.ggml.tokens").strings();
  const auto& merges = m.get_array("tokenizer.ggml.merges").strings();
  ASSERT_EQ(tokens.size(), 1024u);
  EXPECT_EQ(m.get_array("tokenizer.ggml.token_type").size(), 1024u);
  EXPECT_EQ(std::set<std::string>(tokens.begin(), tokens.end()).size(), tokens.size());
  const std::set<std::string> known(tokens.begin(), tokens.end());
  for (const std::string& merge : merges) {
    const auto space = merge.find(' ');
    ASSERT_NE(space, std::string::npos);
    const std::string left = merge.substr(0, space), right = merge.substr(space + 1);
    EXPECT_TRUE(known.contains(left) && known.contains(right) && known.contains(left + right)) << merge;
  }
  EXPECT_EQ(tokens[size_t(m.get_int64("tokenizer.ggml.eos_token_id"))], "<|im_end|>");
  EXPECT_EQ(tokens[1024 - 5], "<|endoftext|>");
  EXPECT_EQ(tokens[1024 - 1], "</think>");
  EXPECT_EQ(tokens['A'], "A");    // printable bytes stand for themselves
  EXPECT_EQ(tokens[' '], "\xC4\xA0");  // GPT-2's U+0120 for the space byte
}

TEST(Synth, FullVocabularyHasTheRealSpecialIds) {
  gguf::Metadata m;
  write_synth_vocab(248320, m);
  const auto& tokens = m.get_array("tokenizer.ggml.tokens").strings();
  ASSERT_EQ(tokens.size(), 248320u);
  EXPECT_EQ(tokens[248044], "<|endoftext|>");
  EXPECT_EQ(tokens[248045], "<|im_start|>");
  EXPECT_EQ(tokens[248046], "<|im_end|>");
  EXPECT_EQ(tokens[248068], "<think>");
  EXPECT_EQ(tokens[248069], "</think>");
  EXPECT_EQ(m.get_int64("tokenizer.ggml.eos_token_id"), 248046);
  EXPECT_EQ(m.get_array("tokenizer.ggml.merges").size(), size_t(248044 - 256));
}

TEST(Synth, SameSeedSameBytes) {
  const test::TempDir dir;
  SynthOptions o;
  o.layers = 1;
  o.recipe = "q8_0";
  write_synth(dir / "a.gguf", o);
  write_synth(dir / "b.gguf", o);
  o.seed = 2;
  write_synth(dir / "c.gguf", o);
  EXPECT_EQ(test::read_bytes(dir / "a.gguf"), test::read_bytes(dir / "b.gguf"));
  EXPECT_NE(test::read_bytes(dir / "a.gguf"), test::read_bytes(dir / "c.gguf"));
}

// Routes every token of the vocabulary through block 0's router (the residual stream there is
// the embedding) and counts top-k picks per expert.
std::vector<int64_t> expert_counts(const gguf::Reader& in, const Qwen35MoeConfig& c) {
  const auto embd = dequantize(in.tensor("token_embd.weight"));
  const auto norm = dequantize(in.tensor("blk.0.post_attention_norm.weight"));
  const auto router = dequantize(in.tensor("blk.0.ffn_gate_inp.weight"));
  const size_t h = size_t(c.hidden), e = size_t(c.n_experts);
  std::vector<int64_t> counts(e, 0);
  std::vector<float> x(h);
  std::vector<std::pair<float, size_t>> logits(e);
  for (size_t tok = 0; tok < size_t(c.vocab); ++tok) {
    double ss = 0;
    for (size_t i = 0; i < h; ++i) ss += double(embd[tok * h + i]) * embd[tok * h + i];
    const float scale = float(1.0 / std::sqrt(ss / double(h) + c.rms_eps));
    for (size_t i = 0; i < h; ++i) x[i] = embd[tok * h + i] * scale * norm[i];
    for (size_t j = 0; j < e; ++j) {
      float dot = 0;
      for (size_t i = 0; i < h; ++i) dot += router[j * h + i] * x[i];
      logits[j] = {dot, j};
    }
    std::partial_sort(logits.begin(), logits.begin() + c.n_experts_used, logits.end(),
                      [](auto& a, auto& b) { return a.first > b.first; });
    for (int64_t k = 0; k < c.n_experts_used; ++k) counts[logits[size_t(k)].second]++;
  }
  std::sort(counts.rbegin(), counts.rend());
  return counts;
}

TEST(Synth, RouteSkewMakesPopularityZipfLike) {
  const test::TempDir dir;
  SynthOptions o;
  o.layers = 1;
  o.recipe = "f32";
  write_synth(dir / "flat.gguf", o);
  o.route_skew = 1.0;
  write_synth(dir / "skew.gguf", o);
  const Qwen35MoeConfig c = synth_config("tiny", 1, false);
  const auto flat = expert_counts(gguf::Reader(dir / "flat.gguf"), c);
  const auto skew = expert_counts(gguf::Reader(dir / "skew.gguf"), c);
  const double picks = double(c.vocab * c.n_experts_used);
  auto shares = [picks](const std::vector<int64_t>& counts) {
    std::string s;
    for (int64_t n : counts) s += fmt::format(" {:.3f}", double(n) / picks);
    return s;
  };
  std::printf("expert shares, most popular first\n  S=0:%s\n  S=1:%s\n", shares(flat).c_str(),
              shares(skew).c_str());
  // Uniform: no expert far from its 1/E share. Skewed: the top expert well above it, the tail
  // well below, and the top share near the law's prediction (see docs/SYNTH.md).
  EXPECT_LT(double(flat.front()) / picks, 2.0 / double(c.n_experts));
  EXPECT_GT(double(skew.front()) / picks, 2.5 / double(c.n_experts));
  EXPECT_LT(double(skew.back()) / picks, 0.3 / double(c.n_experts));
  EXPECT_GT(skew.front(), 4 * skew[size_t(c.n_experts / 2)]);
}

TEST(Synth, CommandLine) {
  const test::TempDir dir;
  const auto out = (dir / "cli.gguf").string();
  auto r = test::run_lode("synth -o '" + out + "' --preset tiny --layers 1 --recipe q8_0 --seed 3",
                          dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_config(gguf::Reader(out).metadata()).n_layers, 1);
  r = test::run_lode("synth -o '" + out + "' --preset qwen9", dir.path());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("qwen3.6-35b-a3b"), std::string::npos) << r.err;
  // quantize --recipe turns the q8_0 model into the UD-like mix.
  const auto ud = (dir / "ud.gguf").string();
  r = test::run_lode("quantize '" + out + "' '" + ud + "' --recipe ud-q4_k_xl", dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  const gguf::Reader q(ud);
  EXPECT_EQ(q.tensor("blk.0.ffn_up_exps.weight").ggml_type(), GgmlType::Q4_K);
  EXPECT_EQ(q.tensor("blk.0.ffn_down_exps.weight").ggml_type(), GgmlType::Q5_K);
  EXPECT_EQ(q.tensor("token_embd.weight").ggml_type(), GgmlType::Q6_K);
  EXPECT_EQ(q.tensor("blk.0.ffn_gate_inp.weight").ggml_type(), GgmlType::F32);
  EXPECT_EQ(q.metadata().get_int64("general.file_type"), 15);
}

}  // namespace

namespace {

// A copy of the model at `from` whose metadata `edit` changes, and whose tensor `replaced` (if any)
// holds `bytes` instead (the other tensors as they are).
void copy_with(const std::filesystem::path& from, const std::filesystem::path& to,
               const std::function<void(gguf::Metadata&)>& edit, const std::string& replaced = "",
               std::span<const uint8_t> bytes = {}) {
  const gguf::Reader reader(from);
  gguf::Writer writer;
  for (const gguf::KeyValue& kv : reader.metadata().entries()) writer.set(kv.key, kv.value);
  edit(writer.metadata());
  for (const gguf::TensorInfo& t : reader.tensors())
    writer.add_tensor(t.name, t.ggml_type(), std::span<const int64_t>(t.ne.data(), size_t(t.n_dims)),
                      t.name == replaced ? bytes : t.bytes());
  writer.write(to);
}

void copy_with_metadata(const std::filesystem::path& from, const std::filesystem::path& to,
                        const std::function<void(gguf::Metadata&)>& edit) {
  copy_with(from, to, edit);
}

// A tiny q8_0 synth of `layers` layers (and the MTP block when `mtp`) written to `path`.
const std::filesystem::path& write_tiny(const std::filesystem::path& path, int64_t layers, bool mtp = false) {
  SynthOptions o;
  o.layers = layers;
  o.mtp = mtp;
  o.recipe = "q8_0";
  write_synth(path, o);
  return path;
}

// Metadata that disagrees with the file's tensors is refused where the weights are bound, naming
// the tensor: a block_count that leaves blocks out (a 9-block file that said 5 ran with 4 layers),
// and a nextn_predict_layers that puts the MTP block elsewhere (it ran as a layer, or silently
// without drafts).
TEST(Synth, MetadataThatDisagreesWithTheTensorsIsRefused) {
  const test::TempDir dir;
  write_tiny(dir / "m.gguf", 4, /*mtp=*/true);
  const auto bind = [](const std::filesystem::path& path) {
    const gguf::Reader reader(path);
    bind_weights(reader, read_config(reader.metadata()));
  };
  ASSERT_NO_THROW(bind(dir / "m.gguf"));
  copy_with_metadata(dir / "m.gguf", dir / "fewer.gguf",
                     [](gguf::Metadata& m) { m.set("qwen35moe.block_count", gguf::Value(uint32_t(4))); });
  EXPECT_TRUE(test::fails_with([&] { bind(dir / "fewer.gguf"); }, {"is in block 4, but qwen35moe.block_count is 4"}));
  copy_with_metadata(dir / "m.gguf", dir / "no-mtp.gguf",
                     [](gguf::Metadata& m) { m.set("qwen35moe.nextn_predict_layers", gguf::Value(uint32_t(0))); });
  EXPECT_TRUE(test::fails_with([&] { bind(dir / "no-mtp.gguf"); }, {"belongs to the MTP block"}));
}

// A model that computes NaN logits (its output norm's weights are NaN) is an error in every command
// that reads logits, as in lode run: lode logits wrote them and kv-quality printed a table of nan,
// both with exit 0 (kv-quality's check runs in an OpenMP loop, where a throw used to terminate).
TEST(Synth, CommandsRefuseLogitsThatAreNotFinite) {
  const test::TempDir dir;
  write_tiny(dir / "m.gguf", 4);
  const int64_t hidden = synth_config("tiny", 4, false).hidden;
  const std::vector<float> nan(size_t(hidden), NAN);
  copy_with(dir / "m.gguf", dir / "nan.gguf", [](gguf::Metadata&) {}, "output_norm.weight",
            std::span(reinterpret_cast<const uint8_t*>(nan.data()), nan.size() * sizeof(float)));
  const std::string m = " -m '" + (dir / "nan.gguf").string() + "' ";
  auto r = test::run_lode("logits" + m + "--backend cpu --tokens 1,2 -o '" + (dir / "l.bin").string() + "'", dir.path());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("is nan"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "l.bin"));
  r = test::run_lode("kv-quality" + m + "--backend cpu --random-tokens 8 --greedy 1 --formats fp16", dir.path());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("not finite"), std::string::npos) << r.err;
}

}  // namespace
