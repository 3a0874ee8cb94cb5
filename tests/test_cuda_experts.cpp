// The expert tier on the GPU (cuda/expert_tier.h): the session holds exactly what the memory plan
// says, and the tokens never depend on the budget. On lode-mini and on the 35B-A3B geometry with
// four layers, every expert resident, half of them, and none (read in place from pinned host RAM
// over PCIe, or computed by the CPU miss path, or split between both), with another placement and
// with swaps too: the prompt's logits at every position and the greedy decode's logits are bit for
// bit the same, and the counters say where each routing went. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/reader.h"
#include "model/synth.h"
#include "model/weights.h"
#include "plan/memory_plan.h"
#include "support/gpu.h"
#include "support/paths.h"
#include "test_gguf_helpers.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/session.h"
#include "cuda/vram.h"

namespace {

namespace fs = std::filesystem;
using lode::cuda::CudaSession;
using lode::cuda::CudaSessionOptions;
using lode::cuda::VramUse;
using lode::plan::MissPath;

int argmax(const std::vector<float>& v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

// The prompt's logits at every position, then `steps` greedy decode steps' logits, one after another.
std::vector<float> run(CudaSession& gpu, const std::vector<int32_t>& prompt, int steps) {
  std::vector<float> out = gpu.prefill(prompt, true);
  std::vector<float> last(out.end() - gpu.vocab(), out.end());
  for (int i = 0; i < steps; ++i) {
    last = gpu.decode(argmax(last));
    out.insert(out.end(), last.begin(), last.end());
  }
  return out;
}

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, int64_t seed) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(int32_t((i * 7919 + seed * 104729 + 13) % vocab));
  return p;
}

// Every category the accountant holds equals the plan's figure for it.
void expect_holds_the_plan(const CudaSession& gpu) {
  const lode::plan::MemoryPlan& p = gpu.plan();
  const auto& vram = gpu.vram();
  EXPECT_EQ(vram.held(VramUse::weights), p.trunk);
  EXPECT_EQ(vram.held(VramUse::experts), p.expert_slots);
  EXPECT_EQ(vram.held(VramUse::kv), p.kv);
  EXPECT_EQ(vram.held(VramUse::state), p.states);
  EXPECT_EQ(vram.held(VramUse::scratch), p.decode_scratch + p.prompt_scratch);
  EXPECT_LE(vram.held(), vram.budget());
}

// The same prompt and greedy run at every share of experts in VRAM (all, half, none) and with two
// placements; every logit bit for bit the same, the counters as the shares say.
void expect_same_at_every_budget(const fs::path& model, const std::string& what, int64_t prompt_tokens, int steps,
                                 int64_t chunk) {
  const lode::gguf::Reader reader(model);
  const auto config = lode::model::read_config(reader.metadata());
  const int64_t total = config.n_layers * config.n_experts;
  const std::vector<int32_t> prompt = prompt_of(prompt_tokens, config.vocab, 1);
  std::vector<double> reversed(static_cast<size_t>(total));
  std::iota(reversed.begin(), reversed.end(), 0.0);  // another placement: the highest indices first
  struct Case {
    const char* name;
    int64_t resident;
    MissPath miss;
    std::vector<double> scores;
    bool swapping = false;
  };
  const std::vector<Case> cases = {{"all", -1, MissPath::automatic, {}},
                                   {"half, misses on the GPU", total / 2, MissPath::gpu, {}},
                                   {"half, misses on the CPU", total / 2, MissPath::cpu, {}},
                                   {"half, misses split, other placement", total / 2, MissPath::automatic, reversed},
                                   {"half, swapping after every step, misses on the CPU", total / 2, MissPath::cpu, {}, true},
                                   {"half, swapping after every step, misses on the GPU", total / 2, MissPath::gpu, {}, true},
                                   {"none, misses on the GPU", 0, MissPath::gpu, {}},
                                   {"none, misses on the CPU", 0, MissPath::cpu, {}},
                                   {"none, misses split", 0, MissPath::automatic, {}}};
  std::vector<float> reference;
  for (const Case& c : cases) {
    SCOPED_TRACE(what + ", experts in VRAM: " + c.name);
    CudaSessionOptions options{.max_context = 1024, .max_resident_experts = c.resident, .expert_scores = c.scores};
    options.prompt_chunk = chunk;
    options.miss_path = c.miss;
    // Frozen placement, or swaps whenever an expert was chosen more than one in VRAM since the start.
    options.swaps = c.swapping ? lode::plan::SwapOptions{.every = 1, .per_round = 16, .ratio = 1.0, .floor = 0.5}
                               : lode::plan::SwapOptions{.enabled = false};
    CudaSession gpu(reader, config, options);
    expect_holds_the_plan(gpu);
    const auto got = run(gpu, prompt, steps);
    const lode::cuda::ExpertStats stats = gpu.expert_stats();
    std::printf("[ cuda ] %s, %s: %lld of %lld experts in VRAM (%s), hit rate %.3f, %.1f MiB over PCIe, %llu decode "
                "misses on the CPU; %s\n",
                what.c_str(), c.name, static_cast<long long>(stats.resident), static_cast<long long>(stats.total),
                stats.host_tier.c_str(), stats.hit_rate(),
                double(stats.decode_miss_bytes + stats.prompt_miss_bytes) / double(1 << 20),
                static_cast<unsigned long long>(stats.cpu_experts), stats.miss_path.c_str());
    const uint64_t routings = uint64_t((prompt_tokens + steps) * config.n_layers * config.n_experts_used);
    EXPECT_EQ(stats.routed, routings);
    EXPECT_EQ(stats.resident, c.resident < 0 ? total : c.resident);
    if (c.resident < 0) {
      EXPECT_EQ(stats.missed, 0u);
      EXPECT_EQ(stats.decode_miss_bytes + stats.prompt_miss_bytes, 0u);
    }
    if (c.resident == 0) {
      EXPECT_EQ(stats.missed, routings);
      EXPECT_TRUE(stats.host_tier == "registered in place" || stats.host_tier == "a pinned copy") << stats.host_tier;
      EXPECT_GT(stats.prompt_miss_bytes, 0u);
    }
    if (c.resident > 0) {
      EXPECT_GT(stats.missed, 0u);
      EXPECT_LT(stats.missed, routings);
    }
    EXPECT_EQ(stats.swaps > 0, c.swapping) << stats.swaps << " swaps";
    // Who computed the decode steps' misses.
    if (c.miss == MissPath::gpu || c.resident < 0) EXPECT_EQ(stats.cpu_experts, 0u);
    if (c.miss == MissPath::cpu && c.resident >= 0) {
      EXPECT_GT(stats.cpu_experts, 0u);
      EXPECT_EQ(stats.decode_miss_bytes, 0u) << "decode misses read over PCIe with --miss-path cpu";
    }
    if (c.miss == MissPath::cpu && c.resident == 0) {
      EXPECT_EQ(stats.cpu_experts, uint64_t(steps * config.n_layers * config.n_experts_used));
      // The hints (routed from each layer's input before its mixer) named some of them.
      EXPECT_GT(stats.cpu_hinted_experts, 0u);
      EXPECT_LT(stats.cpu_hinted_experts, stats.cpu_experts);
    }
    if (c.swapping) std::printf("[ cuda ] %s: %lld swaps\n", what.c_str(), static_cast<long long>(stats.swaps));
    if (reference.empty()) {
      reference = got;
      continue;
    }
    ASSERT_EQ(got.size(), reference.size());
    size_t differing = 0, first = got.size();
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &reference[i], sizeof(float)) != 0) ++differing, first = std::min(first, i);
    // Where they start, so that a rare failure says which position went first (stop 63 saw one).
    const size_t row = first / size_t(config.vocab);
    EXPECT_EQ(differing, 0u) << "logits that differ from every expert in VRAM, from "
                             << (row < size_t(prompt_tokens) ? "prompt position " + std::to_string(row)
                                                             : "decode step " + std::to_string(row - size_t(prompt_tokens)));
  }
}

TEST(CudaExperts, LodeMiniGivesTheSameLogitsAtEveryBudget) {
  LODE_REQUIRE_GPU();
  expect_same_at_every_budget(lode::test::mini_model_path(), "lode-mini", 150, 24, 64);
}

TEST(CudaExperts, TheFullGeometryGivesTheSameLogitsAtEveryBudget) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  lode::model::SynthOptions synth;
  synth.preset = "qwen3.6-35b-a3b";
  synth.recipe = "ud-q4_k_xl";
  synth.layers = 4;
  synth.seed = 5;
  synth.route_skew = 1.0;
  lode::model::write_synth(dir / "m.gguf", synth);
  // Chunks of 512 tokens route to nearly every expert: the prompt pass copies a layer's first groups
  // during its mixer (and, under skewed routing, sometimes has to copy again).
  expect_same_at_every_budget(dir / "m.gguf", "35b-a3b x4 layers", 600, 12, 512);
}

// A budget below the trunk, the K/V cache and the smallest scratch is refused before any upload,
// saying how many MiB are short.
TEST(CudaExperts, ABudgetBelowTheMinimumIsRefused) {
  LODE_REQUIRE_GPU();
  const lode::gguf::Reader reader(lode::test::mini_model_path());
  const auto config = lode::model::read_config(reader.metadata());
  try {
    CudaSession gpu(reader, config, {.max_context = 1024, .vram_budget = size_t(4) << 20});
    FAIL() << "a 4 MiB budget was enough";
  } catch (const lode::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("short by"), std::string::npos) << what;
    EXPECT_NE(what.find("MiB"), std::string::npos) << what;
  }
}

// The CPU miss path reproduces the GPU's 8-bit products; asked for with float32 activations it is
// refused, saying why, and automatic falls back to the GPU.
TEST(CudaExperts, TheCpuMissPathNeedsEightBitActivations) {
  LODE_REQUIRE_GPU();
  const lode::gguf::Reader reader(lode::test::mini_model_path());
  const auto config = lode::model::read_config(reader.metadata());
  CudaSessionOptions options{.max_context = 256, .max_resident_experts = 0};
  options.activations = lode::model::Activations::f32;
  options.miss_path = MissPath::cpu;
  try {
    CudaSession gpu(reader, config, options);
    FAIL() << "--miss-path cpu ran with float32 activations";
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--activations q8"), std::string::npos) << e.what();
  }
  options.miss_path = MissPath::automatic;
  CudaSession gpu(reader, config, options);
  EXPECT_NE(gpu.expert_stats().miss_path.find("gpu"), std::string::npos) << gpu.expert_stats().miss_path;
}

}  // namespace

#else

TEST(CudaExperts, NeedsACudaBuild) { LODE_REQUIRE_GPU(); }

#endif
