// The plan over several GPUs (plan/gpu_split.h), from the file alone: contiguous layer ranges that
// cover the model, each GPU within its budget, no expert on two GPUs, one GPU equal to the one-GPU
// plan, and clear refusals.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "gguf/reader.h"
#include "model/synth.h"
#include "model/weights.h"
#include "plan/gpu_split.h"
#include "plan/routing_profile.h"
#include "support/paths.h"
#include "support/run_lode.h"
#include "test_gguf_helpers.h"

namespace {

using namespace lode;

constexpr size_t kMiB = size_t(1) << 20;

// Checks what every split must be: the ranges in order, covering every layer, each GPU's fixed
// bytes and expert slots within its budget, the owner table agreeing with the counts.
void expect_sound(const plan::GpuSplit& s, const model::ModelWeights& w) {
  int64_t next = 0;
  for (const plan::GpuShare& g : s.gpus) {
    EXPECT_EQ(g.first_layer, next);
    EXPECT_GT(g.end_layer, g.first_layer);
    EXPECT_LE(g.fixed() + size_t(g.experts) * s.slot_bytes, g.budget);
    next = g.end_layer;
  }
  EXPECT_EQ(next, int64_t(w.layers.size()));
  ASSERT_EQ(s.owner.size(), size_t(s.experts_total));
  std::vector<int64_t> held(s.gpus.size(), 0);
  for (int32_t o : s.owner) {
    ASSERT_GE(o, -1);
    ASSERT_LT(o, int32_t(s.gpus.size()));
    if (o >= 0) ++held[size_t(o)];  // one owner per expert: never two GPUs
  }
  for (size_t g = 0; g < s.gpus.size(); ++g) EXPECT_EQ(held[g], s.gpus[g].experts) << "GPU " << g;
}

struct Mini {
  Mini() : reader(test::mini_model_path()), weights(model::bind_weights(reader, model::read_config(reader.metadata()))) {}
  gguf::Reader reader;
  model::ModelWeights weights;
};

TEST(GpuSplit, OneGpuIsTheOneGpuPlan) {
  const Mini m;
  for (const size_t budget : {size_t(48) * kMiB, size_t(1024) * kMiB})
  for (const int64_t pool : {int64_t(0), int64_t(1536)}) {  // (a shared K/V pool for two sequences, or none)
    SCOPED_TRACE(pool);
    const plan::PlanOptions o{.budget = budget, .kv = kv::Format::f16, .context = 1024, .parallel = pool ? 2 : 1,
                              .kv_positions = pool, .prompt_chunk = 512};
    const plan::MemoryPlan one = plan::plan_memory(m.weights, o);
    ASSERT_EQ(one.prompt_chunk, 512);  // not shrunk: the split does not shrink chunks
    const plan::GpuSplit s = plan::split_over_gpus(m.weights, o, std::vector<size_t>{budget});
    expect_sound(s, m.weights);
    ASSERT_EQ(s.gpus.size(), 1u);
    EXPECT_EQ(s.gpus[0].trunk, one.trunk);
    EXPECT_EQ(s.gpus[0].kv, one.kv);
    EXPECT_EQ(s.gpus[0].states, one.states);
    EXPECT_EQ(s.gpus[0].scratch, one.decode_scratch + one.prompt_scratch);
    EXPECT_EQ(s.slot_bytes, one.slot_bytes);
    EXPECT_EQ(s.experts_resident(), one.experts_resident);
  }
}

// Two and four GPUs, each of the budget that holds the whole trunk and ten experts on one: each
// holds more (fewer layers), together as many distinct experts as they have slots for, each GPU
// its own layers' first; and with unequal budgets the larger takes more of the layers.
TEST(GpuSplit, SeveralGpusShareTheLayersAndNeverAnExpert) {
  const Mini m;
  const plan::PlanOptions o{.kv = kv::Format::f16, .context = 1024, .prompt_chunk = 512};
  // A budget that holds the whole trunk and ten experts on one GPU.
  const plan::GpuShare whole = plan::split_over_gpus(m.weights, o, std::vector<size_t>{size_t(1024) * kMiB}).gpus[0];
  const size_t slot = plan::split_over_gpus(m.weights, o, std::vector<size_t>{size_t(1024) * kMiB}).slot_bytes;
  const size_t budget = whole.fixed() + 10 * slot;
  const plan::GpuSplit one = plan::split_over_gpus(m.weights, o, std::vector<size_t>{budget});
  ASSERT_EQ(one.experts_resident(), 10);
  for (const size_t n : {size_t(2), size_t(4)}) {
    SCOPED_TRACE(n);
    const plan::GpuSplit s = plan::split_over_gpus(m.weights, o, std::vector<size_t>(n, budget));
    expect_sound(s, m.weights);
    ASSERT_EQ(s.gpus.size(), n);
    EXPECT_GE(s.experts_resident(), int64_t(n) * 10);  // each GPU holds fewer layers than one did
    int64_t slots = 0;  // together: as many distinct experts as they have slots for
    for (const plan::GpuShare& g : s.gpus) slots += int64_t((g.budget - g.fixed()) / s.slot_bytes);
    EXPECT_EQ(s.experts_resident(), std::min(slots, s.experts_total));
    int64_t own = 0;
    for (size_t i = 0; i < s.owner.size(); ++i) {
      const int32_t g = s.owner[i];
      const int64_t layer = int64_t(i) / m.weights.config.n_experts;
      if (g >= 0 && layer >= s.gpus[size_t(g)].first_layer && layer < s.gpus[size_t(g)].end_layer) ++own;
    }
    EXPECT_GT(own, 0);
    EXPECT_GE(s.gpus.back().trunk, plan::head_bytes(m.weights));  // the lm head is on the last
  }
  // Unequal budgets: the larger GPU takes more of the layers.
  const plan::GpuSplit uneven = plan::split_over_gpus(m.weights, o, std::vector<size_t>{size_t(200) * kMiB,
                                                                                        size_t(30) * kMiB});
  expect_sound(uneven, m.weights);
  EXPECT_GT(uneven.gpus[0].end_layer - uneven.gpus[0].first_layer,
            uneven.gpus[1].end_layer - uneven.gpus[1].first_layer);
}

// Each GPU's figures are what a session for its share of the layers plans (model::layer_share's
// weights, plan::share_options), its scratch at most the split's: the sessions of several GPUs
// allocate what the split promised. With the MTP block, the last GPU holds it and its K/V cache.
TEST(GpuSplit, EachGpuIsThePlanOfItsShareOfTheLayers) {
  const Mini m;
  ASSERT_TRUE(m.weights.mtp.has_value());
  for (const bool mtp : {false, true})
  for (const int64_t pool : {int64_t(0), int64_t(1536)})
    for (const size_t n : {size_t(2), size_t(3)}) {
      SCOPED_TRACE(testing::Message() << n << " GPUs, pool " << pool << (mtp ? ", MTP" : ""));
      const plan::PlanOptions o{.kv = kv::Format::k8v8, .context = 1024, .parallel = 2, .kv_positions = pool,
                                .step_rows = 2, .mtp = mtp, .prompt_chunk = 512};
      const plan::GpuSplit s = plan::split_over_gpus(m.weights, o, std::vector<size_t>(n, size_t(40) * kMiB));
      expect_sound(s, m.weights);
      std::vector<plan::MemoryPlan> plans;
      for (size_t g = 0; g < n; ++g) {
        const plan::GpuShare& gpu = s.gpus[g];
        const model::ModelWeights share = model::layer_share(m.weights, gpu.first_layer, gpu.end_layer);
        EXPECT_EQ(share.config.n_layers, gpu.end_layer - gpu.first_layer);
        EXPECT_EQ(share.mtp.has_value(), g + 1 == n && m.weights.mtp.has_value());
        const plan::PlanOptions share_o = plan::share_options(s, o, g);
        EXPECT_EQ(share_o.mtp, mtp && g + 1 == n);
        const plan::MemoryPlan p = plan::plan_memory(share, share_o);
        EXPECT_EQ(p.trunk, gpu.trunk) << "GPU " << g;
        EXPECT_EQ(p.kv, gpu.kv) << "GPU " << g;
        EXPECT_EQ(p.states, gpu.states) << "GPU " << g;
        EXPECT_LE(p.decode_scratch + p.prompt_scratch, gpu.scratch) << "GPU " << g;  // (the split's: counted high)
        EXPECT_EQ(p.prompt_chunk, s.prompt_chunk);
        EXPECT_EQ(p.slot_bytes, s.slot_bytes);
        EXPECT_LE(p.used(), gpu.budget);
        // Its own layers' experts, as many as fit: at least those the split gives it of them.
        int64_t own = 0;
        for (int64_t l = gpu.first_layer; l < gpu.end_layer; ++l)
          for (int64_t e = 0; e < m.weights.config.n_experts; ++e)
            own += s.owner[size_t(l * m.weights.config.n_experts + e)] == int32_t(g);
        EXPECT_GE(p.experts_resident, own);
        EXPECT_EQ(p.experts_total, share.config.n_layers * m.weights.config.n_experts);
        plans.push_back(p);
      }
      // Together: the whole model's layers and head, a hand-on norm for each GPU but the last.
      const plan::MemoryPlan all = plan::together(plans);
      EXPECT_EQ(all.options.budget, n * size_t(40) * kMiB);
      EXPECT_EQ(all.trunk, plan::trunk_bytes(m.weights) + (n - 1) * plan::hand_on_bytes(m.weights.config) +
                               (mtp ? plan::mtp_trunk_bytes(m.weights) : 0));
      EXPECT_EQ(all.experts_total, m.weights.config.n_layers * m.weights.config.n_experts);
      EXPECT_EQ(all.expert_bytes.size(), m.weights.layers.size());
      int64_t resident = 0;
      for (const plan::MemoryPlan& p : plans) resident += p.experts_resident;
      EXPECT_EQ(all.experts_resident, resident);
    }
  EXPECT_THROW(model::layer_share(m.weights, 2, 2), Error);
  EXPECT_THROW(model::layer_share(m.weights, 0, int64_t(m.weights.layers.size()) + 1), Error);
}

// A routing profile's scores decide which experts are placed: the most wanted first, on their
// own layer's GPU while it has room, else on another GPU (never left in host RAM while a GPU has
// room for them).
TEST(GpuSplit, TheMostWantedExpertsArePlaced) {
  const Mini m;
  const model::Qwen35MoeConfig& c = m.weights.config;
  const plan::PlanOptions o{.kv = kv::Format::f16, .context = 1024, .prompt_chunk = 512};
  std::vector<double> scores(size_t(c.n_layers * c.n_experts), 0.0);
  for (int64_t e = 0; e < c.n_experts; ++e) scores[size_t(e)] = 1.0 + double(e);  // only layer 0's are wanted
  const plan::GpuSplit big = plan::split_over_gpus(m.weights, o, std::vector<size_t>{size_t(1024) * kMiB});
  // One GPU with room for 10: layer 0's ten highest.
  const size_t ten = big.gpus[0].fixed() + 10 * big.slot_bytes;
  const plan::GpuSplit one = plan::split_over_gpus(m.weights, o, std::vector<size_t>{ten}, scores);
  expect_sound(one, m.weights);
  for (int64_t e = 0; e < c.n_experts; ++e) EXPECT_EQ(one.owner[size_t(e)] >= 0, e >= c.n_experts - 10) << e;
  // Two GPUs, GPU 0 (which holds layer 0) with ample room: layer 0's experts all on GPU 0. (A GPU
  // too full for its own layer's experts: OneLayerEachTightBudgetsCapsAndSpills.)
  const plan::GpuSplit two = plan::split_over_gpus(m.weights, o, std::vector<size_t>{size_t(1024) * kMiB, ten}, scores);
  expect_sound(two, m.weights);
  for (int64_t e = 0; e < c.n_experts; ++e) EXPECT_EQ(two.owner[size_t(e)], 0) << e;
}

// The cut fits wherever a contiguous cut fits: cases where ending each range at the nearest
// proportional share would put a layer too many on a GPU (found in review).
TEST(GpuSplit, TheLayerCutFitsWhereverACutFits) {
  const auto loads = [](std::span<const size_t> costs, const std::vector<int64_t>& ends) {
    std::vector<double> out;
    int64_t start = 0;
    for (int64_t end : ends) {
      out.push_back(0);
      for (int64_t l = start; l < end; ++l) out.back() += double(costs[size_t(l)]);
      start = end;
    }
    return out;
  };
  struct Case {
    std::vector<size_t> costs;
    std::vector<double> room;
  };
  for (const Case& k : {Case{{14, 10, 14, 10}, {41, 23}}, Case{{15, 10, 15, 40, 15}, {118, 32, 109}},
                        Case{{5, 5, 5, 5}, {100, 100, 100, 100}}, Case{{10, 10, 10}, {30, 0.5, 30}}}) {
    const plan::LayerCut cut = plan::cut_layers(k.costs, k.room);
    ASSERT_EQ(cut.ends.size(), k.room.size());
    EXPECT_EQ(cut.ends.back(), int64_t(k.costs.size()));
    const std::vector<double> load = loads(k.costs, cut.ends);
    for (size_t g = 0; g < load.size(); ++g) {
      EXPECT_GE(load[g], 1.0) << "GPU " << g << ": no layer";
      if (k.room[g] >= 1.0) EXPECT_LE(load[g], k.room[g]) << "GPU " << g;
    }
    EXPECT_EQ(cut.load <= 1.0, k.room[1] >= 1.0) << cut.load;  // the last case cannot fit: a GPU with no room
  }
}

// With as many GPUs as layers each takes one; a tight budget halves the prompt chunk as on one GPU;
// a cap on resident experts holds for all GPUs together; an expert whose own GPU is full goes to
// another GPU rather than staying in host RAM.
TEST(GpuSplit, OneLayerEachTightBudgetsCapsAndSpills) {
  const Mini m;
  const model::Qwen35MoeConfig& c = m.weights.config;
  const plan::PlanOptions o{.kv = kv::Format::f16, .context = 1024, .prompt_chunk = 512};
  const plan::GpuSplit each = plan::split_over_gpus(m.weights, o, std::vector<size_t>(size_t(c.n_layers), 200 * kMiB));
  expect_sound(each, m.weights);
  for (size_t g = 0; g < each.gpus.size(); ++g) EXPECT_EQ(each.gpus[g].end_layer - each.gpus[g].first_layer, 1);

  const plan::MemoryPlan roomy = plan::plan_memory(m.weights, {.budget = 4096 * kMiB, .context = 1024, .prompt_chunk = 512});
  plan::PlanOptions tight = o;
  tight.budget = roomy.fixed() - 1;  // one GPU halves its chunk here
  const plan::MemoryPlan shrunk = plan::plan_memory(m.weights, tight);
  ASSERT_LT(shrunk.prompt_chunk, 512);
  const plan::GpuSplit one = plan::split_over_gpus(m.weights, tight, std::vector<size_t>{tight.budget});
  EXPECT_EQ(one.prompt_chunk, shrunk.prompt_chunk);
  EXPECT_EQ(one.experts_resident(), shrunk.experts_resident);

  plan::PlanOptions capped = o;
  capped.max_resident_experts = 7;
  EXPECT_EQ(plan::split_over_gpus(m.weights, capped, std::vector<size_t>(2, 200 * kMiB)).experts_resident(), 7);

  // GPU 0 with room for layer 0 and 3 experts, GPU 1 with plenty: layer 0's wanted experts fill
  // GPU 0 and spill to GPU 1 (where GPU 0 can read GPU 1's memory).
  std::vector<double> scores(size_t(c.n_layers * c.n_experts), 0.0);
  for (int64_t e = 0; e < c.n_experts; ++e) scores[size_t(e)] = 1.0 + double(e);
  const size_t gpu0 = each.gpus[0].fixed() + 3 * each.slot_bytes;  // layer 0 alone, and 3 slots
  const plan::GpuSplit spill = plan::split_over_gpus(m.weights, o, std::vector<size_t>{gpu0, 200 * kMiB}, scores);
  expect_sound(spill, m.weights);
  ASSERT_EQ(spill.gpus[0].first_layer, 0);
  ASSERT_EQ(spill.gpus[0].end_layer, 1);
  int64_t on_home = 0, spilled = 0;
  for (int64_t e = 0; e < c.n_experts; ++e) {
    EXPECT_GE(spill.owner[size_t(e)], 0) << e;
    (spill.owner[size_t(e)] == 0 ? on_home : spilled) += 1;
  }
  EXPECT_EQ(on_home, 3);
  EXPECT_EQ(spilled, c.n_experts - 3);
  for (int64_t e = c.n_experts - 3; e < c.n_experts; ++e) EXPECT_EQ(spill.owner[size_t(e)], 0) << e;  // the most wanted at home
  EXPECT_NE(plan::describe(spill).find(fmt::format("{} of them of other GPUs' layers", spilled)), std::string::npos)
      << plan::describe(spill);
  // Where GPU 0 cannot read GPU 1's memory, none spills there: GPU 1's room goes to its own layers.
  const std::vector<uint8_t> apart = {1, 0, 1, 1};  // [reader][holder]: GPU 1 could read GPU 0, not the reverse
  const plan::GpuSplit kept = plan::split_over_gpus(m.weights, o, std::vector<size_t>{gpu0, 200 * kMiB}, scores, apart);
  expect_sound(kept, m.weights);
  for (int64_t i = 0; i < kept.experts_total; ++i) {
    const int64_t layer = i / c.n_experts;
    const int32_t home = layer < kept.gpus[0].end_layer ? 0 : 1;
    EXPECT_TRUE(kept.owner[size_t(i)] == -1 || kept.owner[size_t(i)] == home) << i;
  }
  EXPECT_EQ(kept.gpus[0].experts, 3);
  EXPECT_THROW(plan::split_over_gpus(m.weights, o, std::vector<size_t>{gpu0, 200 * kMiB}, scores, std::vector<uint8_t>{1}),
               Error);
}

TEST(GpuSplit, WhatCannotFitIsRefusedSayingWhy) {
  const Mini m;
  const plan::PlanOptions o{.kv = kv::Format::f16, .context = 1024, .prompt_chunk = 512};
  try {
    plan::split_over_gpus(m.weights, o, std::vector<size_t>{size_t(200) * kMiB, size_t(1) * kMiB});
    ADD_FAILURE() << "a 1 MiB GPU was given layers";
  } catch (const BudgetShortfall& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("GPU 1"), std::string::npos) << what;
    EXPECT_NE(what.find("short by"), std::string::npos) << what;
  }
  const std::vector<size_t> too_many(size_t(m.weights.config.n_layers + 1), size_t(200) * kMiB);
  EXPECT_THROW(plan::split_over_gpus(m.weights, o, too_many), Error);
  EXPECT_THROW(plan::split_over_gpus(m.weights, o, std::vector<size_t>{}), Error);
}

// lode plan --gpus N prints each GPU's share and the experts' total; a GPU too small is an error.
TEST(GpuSplit, TheCommandPrintsEachGpu) {
  const test::TempDir dir;
  const std::string plan = "plan -m '" + test::mini_model_path().string() + "' --ctx 1024 --prompt-chunk 512 --gpus 2";
  const auto r = test::run_lode(plan + " --vram-budget 40", dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* want : {"2 GPUs of 40.0 MiB each", "GPU 0: budget 40.0 MiB: layers 0-", "GPU 1:", "none on two GPUs"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  const auto small = test::run_lode(plan + " --vram-budget 10", dir.path());
  EXPECT_EQ(small.status, 1);
  EXPECT_NE(small.err.find("short by"), std::string::npos) << small.err;

  // With a routing profile (the later experts of each layer routed more): which experts, and the
  // share of its routings the experts in VRAM take: on one GPU, its most routed ones.
  const Mini m;
  plan::RoutingProfile profile;
  profile.model_name = "test", profile.fingerprint = plan::routing_fingerprint(m.weights);
  profile.layers = m.weights.config.n_layers, profile.experts = m.weights.config.n_experts, profile.tokens = 9;
  for (int64_t i = 0; i < profile.layers * profile.experts; ++i) profile.counts.push_back(uint64_t(1 + i % profile.experts));
  plan::write_profile(dir / "p.json", profile);
  const std::string one = "plan -m '" + test::mini_model_path().string() + "' --ctx 1024 --prompt-chunk 512 --vram-budget 30";
  const auto with = test::run_lode(one + " --expert-profile '" + (dir / "p.json").string() + "'", dir.path());
  ASSERT_EQ(with.status, 0) << with.err;
  const plan::MemoryPlan p = plan::plan_memory(m.weights, {.budget = 30 * kMiB, .kv = kv::Format::f16, .context = 1024,
                                                            .prompt_chunk = 512});
  std::vector<uint64_t> sorted = profile.counts;
  std::sort(sorted.rbegin(), sorted.rend());
  double top = 0, all = 0;
  for (size_t i = 0; i < sorted.size(); ++i) all += double(sorted[i]), top += i < size_t(p.experts_resident) ? double(sorted[i]) : 0;
  ASSERT_LT(p.experts_resident, int64_t(sorted.size()));
  const std::string share = fmt::format("the profile's most routed, take {:.1f}% of its routings", 100.0 * top / all);
  EXPECT_NE(with.out.find(share), std::string::npos) << share << "\n" << with.out;
  const auto spread = test::run_lode(plan + " --vram-budget 40 --expert-profile '" + (dir / "p.json").string() + "'",
                                     dir.path());
  ASSERT_EQ(spread.status, 0) << spread.err;
  EXPECT_NE(spread.out.find("the most routed experts first, by the profile"), std::string::npos) << spread.out;
  EXPECT_NE(spread.out.find("% of the profile's routings"), std::string::npos) << spread.out;
}

}  // namespace
