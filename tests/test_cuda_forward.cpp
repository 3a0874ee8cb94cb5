// The CUDA forward pass (issue 7, first form) against the CPU engine on the same GGUF files: the
// transformers fixtures converted to F32, and a synthesized tiny model (hidden 512) in the q8_0
// and ud-q4_k_xl recipes (Q8_0, Q4_K, Q5_K, Q6_K weights). Logits of every prompt position agree
// to float32 rounding (relative L2 <= 1e-4: both compute in float32, in different orders; the H200
// measured 3e-7 .. 2.2e-6, so the bar leaves a margin of ~50x), greedy tokens are identical, and
// the VRAM budget is kept. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "cpu/session.h"
#include "gguf/reader.h"
#include "model/quantize.h"
#include "model/recipe.h"
#include "model/synth.h"
#include "support/fixtures.h"
#include "support/gpu.h"
#include "test_gguf_helpers.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/session.h"
#include "cuda/vram.h"

namespace {

namespace fs = std::filesystem;

int argmax(const std::vector<float>& v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

// Every-position logits and `greedy` greedy tokens from both engines, compared.
void compare_engines(const fs::path& model, const std::vector<std::vector<int32_t>>& prompts, const std::string& what,
                     int greedy = 16, int cpu_threads = 2) {
  const lode::gguf::Reader reader(model);
  const auto config = lode::model::read_config(reader.metadata());
  lode::cpu::Session cpu(reader, config, {.threads = cpu_threads, .deltanet_chunk = 0});
  lode::cuda::CudaSession gpu(reader, config, {.max_context = 256});
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(what + " prompt " + std::to_string(i));
    cpu.reset();
    gpu.reset();
    const auto want = cpu.prefill(prompts[i], 64, true);
    const auto got = gpu.prefill(prompts[i], true);
    const double err = lode::test::relative_l2(got, want);
    std::printf("[ cuda ] %s prompt %zu: %zu tokens, relative L2 %.3g vs the CPU\n", what.c_str(), i, prompts[i].size(), err);
    EXPECT_LE(err, 1e-4);
    std::vector<float> lc(want.end() - config.vocab, want.end()), lg(got.end() - config.vocab, got.end());
    std::vector<int> greedy_cpu, greedy_gpu;
    for (int step = 0; step < greedy; ++step) {
      greedy_cpu.push_back(argmax(lc));
      greedy_gpu.push_back(argmax(lg));
      if (greedy_cpu.back() != greedy_gpu.back()) break;
      lc = cpu.decode(greedy_cpu.back());
      lg = gpu.decode(greedy_gpu.back());
    }
    EXPECT_EQ(greedy_gpu, greedy_cpu);
  }
}

TEST(CudaForward, FixturesInFloat32MatchTheCpu) {
  LODE_REQUIRE_GPU();
  for (const std::string name : {"tiny_flat", "tiny_nested"}) {
    const lode::test::TempDir dir;
    const auto fixture = lode::test::load_fixture(name);
    lode::test::convert_fixture(fixture, dir / "f32.gguf");
    std::vector<std::vector<int32_t>> prompts;
    for (const auto& p : fixture.prompts) prompts.push_back(p.ids);
    compare_engines(dir / "f32.gguf", prompts, name);
  }
}

TEST(CudaForward, QuantizedSynthMatchesTheCpu) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  lode::model::SynthOptions synth;
  synth.preset = "tiny";
  synth.recipe = "f32";
  synth.seed = 3;
  lode::model::write_synth(dir / "f32.gguf", synth);
  const std::vector<std::vector<int32_t>> prompts = {
      {7}, {17, 300, 4, 999, 512, 88, 61, 230, 1000}, {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 400}};
  for (const std::string recipe : {"q8_0", "ud-q4_k_xl"}) {
    const lode::gguf::Reader in(dir / "f32.gguf");
    lode::model::QuantizeOptions options;
    options.recipe = &lode::model::find_recipe(recipe);
    lode::model::quantize_model(in, dir / (recipe + ".gguf"), options);
    compare_engines(dir / (recipe + ".gguf"), prompts, "synth_tiny " + recipe);
  }
  // IQ4_XS everywhere it fits (the lookup-table kernels in a whole model).
  const lode::gguf::Reader in(dir / "f32.gguf");
  lode::model::QuantizeOptions options;
  options.type = lode::GgmlType::IQ4_XS;
  lode::model::quantize_model(in, dir / "iq4_xs.gguf", options);
  compare_engines(dir / "iq4_xs.gguf", prompts, "synth_tiny iq4_xs");
}

// The real geometry (qwen3.6-35b-a3b: hidden 2048, 256 experts, top 8, head_dim 256, 32 DeltaNet
// value heads, vocab 248320) with four layers (three DeltaNet, one attention), ud-q4_k_xl recipe.
TEST(CudaForward, FullGeometryWithFewerLayersMatchesTheCpu) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  lode::model::SynthOptions synth;
  synth.preset = "qwen3.6-35b-a3b";
  synth.recipe = "ud-q4_k_xl";
  synth.layers = 4;
  synth.seed = 7;
  lode::model::write_synth(dir / "m.gguf", synth);
  compare_engines(dir / "m.gguf", {{11, 5000, 77, 123456, 9, 240000}, {42}}, "35b-a3b x4 layers", 8, 0);
}

TEST(CudaForward, TheBudgetIsKeptAndReported) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  lode::model::SynthOptions synth;
  synth.preset = "tiny";
  synth.recipe = "q8_0";
  lode::model::write_synth(dir / "m.gguf", synth);
  const lode::gguf::Reader reader(dir / "m.gguf");
  const auto config = lode::model::read_config(reader.metadata());
  {
    lode::cuda::CudaSession gpu(reader, config, {.max_context = 128});
    const auto& vram = gpu.vram();
    EXPECT_GT(vram.held(lode::cuda::VramUse::weights), 0u);
    EXPECT_GT(vram.held(lode::cuda::VramUse::experts), 0u);
    EXPECT_GT(vram.held(lode::cuda::VramUse::kv), 0u);
    EXPECT_GT(vram.held(lode::cuda::VramUse::state), 0u);
    // Uploaded as stored: the weights on the device are about the file's size, not float32's.
    EXPECT_LT(vram.held(lode::cuda::VramUse::weights) + vram.held(lode::cuda::VramUse::experts),
              fs::file_size(dir / "m.gguf") + (size_t(4) << 20));
    // Chunked prefill (token by token inside) equals one decode at a time, and reset starts over.
    const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
    const auto all = gpu.prefill(prompt, true);
    gpu.reset();
    for (size_t i = 0; i < prompt.size(); ++i) {
      const auto one = gpu.decode(prompt[i]);
      EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + i * size_t(config.vocab))) << "position " << i;
    }
  }
  try {
    lode::cuda::CudaSession tight(reader, config, {.max_context = 128, .vram_budget = size_t(1) << 20});
    FAIL() << "a 1 MiB budget was enough";
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("short by"), std::string::npos) << e.what();
  }
}

}  // namespace

#else

TEST(CudaForward, NeedsACudaBuild) { GTEST_SKIP() << "lode was built without CUDA (LODE_CUDA=OFF or no nvcc)"; }

#endif
