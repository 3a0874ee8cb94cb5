// The memory plan (plan/memory_plan.h) against each model's own tensor table: the trunk is every
// tensor of the main model but the routed experts, matrices as stored and vectors as float32, plus
// the (expert -> gate | up | down) tables and residency flags; the experts are the *_exps tensors; K/V and DeltaNet
// states follow from the geometry. Checked exactly for the Qwen3.6-35B-A3B geometry (a synth of
// zero weights, sparse on disk) and lode-mini; then the budget's order (chunk shrinking, experts
// in whole slots), the refusals and `lode plan`.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "cuda/weight_types.h"
#include "gguf/reader.h"
#include "model/qwen35moe.h"
#include "model/synth.h"
#include "model/weights.h"
#include "plan/memory_plan.h"
#include "support/paths.h"
#include "support/run_lode.h"
#include "test_gguf_helpers.h"

namespace {

using namespace lode;

constexpr size_t kMiB = size_t(1) << 20;

struct TableFigures {
  size_t trunk = 0, experts = 0;
};

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

// The trunk and the experts as the tensor table gives them.
TableFigures from_tensor_table(const gguf::Reader& r, const model::Qwen35MoeConfig& c) {
  TableFigures f;
  const bool has_output = r.find_tensor("output.weight") != nullptr;
  for (const gguf::TensorInfo& t : r.tensors()) {
    int64_t block = -1;
    if (t.name.rfind("blk.", 0) == 0) block = std::stoll(t.name.substr(4));
    if (block >= c.n_layers) continue;  // the MTP block: not run
    if (t.name == "token_embd.weight" && has_output) continue;  // looked up on the host
    if (ends_with(t.name, "_exps.weight")) {
      f.experts += t.size;
      continue;
    }
    const bool float_vector = t.n_dims == 1 || ends_with(t.name, "ssm_conv1d.weight");
    f.trunk += float_vector ? size_t(t.n_elements()) * 4 : t.size;
  }
  f.trunk += size_t(c.n_layers * 3 * c.n_experts) * sizeof(void*) + size_t(c.n_layers * c.n_experts);  // tables, flags
  const gguf::TensorInfo* gate = r.find_tensor("blk.0.ffn_gate_shexp.weight");
  const gguf::TensorInfo* up = r.find_tensor("blk.0.ffn_up_shexp.weight");
  if (gate && up && gate->type == up->type && gate->ne == up->ne) f.trunk += size_t(c.n_layers) * 2 * sizeof(void*);
  return f;
}

// Checks a plan's every figure against the tensor table and the geometry.
void expect_plan_matches(const gguf::Reader& r, const model::ModelWeights& w, const plan::PlanOptions& o) {
  const model::Qwen35MoeConfig& c = w.config;
  const TableFigures table = from_tensor_table(r, c);
  const plan::MemoryPlan p = plan::plan_memory(w, o);
  EXPECT_EQ(p.trunk, table.trunk);
  EXPECT_EQ(p.experts_host, table.experts);
  const int64_t pages = (o.context + 63) / 64;
  const int64_t cell = kv::cell_bytes(o.kv, c.n_kv_heads, c.head_dim);
  EXPECT_EQ(p.kv, size_t(c.n_full_attention_layers() * pages * 64 * cell + pages * 4));
  const int64_t recurrent = c.n_layers - c.n_full_attention_layers();
  EXPECT_EQ(p.states,
            size_t(recurrent * 4 * (c.conv_channels() * (c.ssm_conv_kernel - 1) + c.ssm_dt_rank * c.ssm_state * c.ssm_state)));
  EXPECT_EQ(p.experts_total, c.n_layers * c.n_experts);
  EXPECT_EQ(p.slot_bytes * size_t(p.experts_total), table.experts);  // every layer's experts alike here
  const size_t fixed = p.trunk + p.kv + p.states + p.decode_scratch + p.prompt_scratch;
  ASSERT_LE(fixed, o.budget);
  EXPECT_EQ(p.experts_resident, std::min<int64_t>(int64_t((o.budget - fixed) / p.slot_bytes), p.experts_total));
  EXPECT_EQ(p.expert_slots, size_t(p.experts_resident) * p.slot_bytes);
  EXPECT_LE(p.used(), o.budget);
  EXPECT_EQ(p.host_pinned, p.all_resident() ? 0 : table.experts);
}

// Whether this file system keeps sparse files (a 35B geometry of zeros would otherwise take 20 GB).
bool holes_supported(const lode::test::TempDir& dir) {
  model::SynthOptions o;
  o.preset = "tiny";
  o.zeros = true;
  write_synth(dir / "probe.gguf", o);
  struct stat st{};
  return ::stat((dir / "probe.gguf").c_str(), &st) == 0 && size_t(st.st_blocks) * 512 < size_t(st.st_size) / 2;
}

TEST(MemoryPlan, TheThirtyFiveBGeometryMatchesItsTensorTable) {
  const lode::test::TempDir dir;
  if (!holes_supported(dir)) GTEST_SKIP() << "this file system keeps no sparse files; the 35B geometry would take 20 GB";
  model::SynthOptions o;
  o.preset = "qwen3.6-35b-a3b";
  o.recipe = "ud-q4_k_xl";
  o.mtp = true;  // its block is in the file, not in the plan
  o.zeros = true;
  write_synth(dir / "m35.gguf", o);
  struct stat st{};
  ASSERT_EQ(::stat((dir / "m35.gguf").c_str(), &st), 0);
  EXPECT_GT(size_t(st.st_size), size_t(20) << 30);
  EXPECT_LT(size_t(st.st_blocks) * 512, size_t(256) << 20) << "zero weights should leave the file sparse";

  const gguf::Reader r(dir / "m35.gguf");
  const model::Qwen35MoeConfig c = model::read_config(r.metadata());
  const model::ModelWeights w = model::bind_weights(r, c);
  // One expert: gate and up Q4_K (512 rows of 2048), down Q5_K (2048 rows of 512).
  const plan::ExpertBytes e = plan::expert_bytes(w).front();
  EXPECT_EQ(e.gate, size_t(512 * 1152));
  EXPECT_EQ(e.up, size_t(512 * 1152));
  EXPECT_EQ(e.down, size_t(2048 * 352));
  for (const int64_t budget_mib : {4096, 8192, 12288, 16384, 24576}) {
    for (const kv::Format f : {kv::Format::f16, kv::Format::q4}) {
      SCOPED_TRACE(std::to_string(budget_mib) + " MiB, " + kv::to_string(f));
      expect_plan_matches(r, w, {.budget = size_t(budget_mib) * kMiB, .kv = f, .context = 32768});
    }
  }
  const plan::MemoryPlan all = plan::plan_memory(w, {.budget = size_t(24576) * kMiB, .kv = kv::Format::f16, .context = 32768});
  EXPECT_TRUE(all.all_resident());
  EXPECT_EQ(all.experts_total, 10240);
  EXPECT_EQ(all.experts_host, size_t(10240) * 1900544);
  EXPECT_NE(plan::summary(all).find("10240 of 10240 in VRAM (100.0%)"), std::string::npos) << plan::summary(all);

  // The smaller the K/V cells, the more experts the same budget keeps (262,144 positions, 16 GiB).
  int64_t previous = -1;
  for (const kv::Format f : {kv::Format::f32, kv::Format::f16, kv::Format::k8v8, kv::Format::k8v4, kv::Format::q4}) {
    const plan::MemoryPlan p = plan::plan_memory(w, {.budget = size_t(16384) * kMiB, .kv = f, .context = 262144});
    EXPECT_GT(p.experts_resident, previous) << kv::to_string(f);
    previous = p.experts_resident;
  }

  // Too small for the trunk and the K/V cache: refused with the MiB short and what would fit.
  try {
    plan::plan_memory(w, {.budget = size_t(2816) * kMiB, .kv = kv::Format::f16, .context = 32768});
    ADD_FAILURE() << "a 2816 MiB budget was accepted";
  } catch (const Error& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find("short by"), std::string::npos) << what;
    EXPECT_NE(what.find("--ctx "), std::string::npos) << what;
    EXPECT_NE(what.find("--kv q4"), std::string::npos) << what;
  }
}

TEST(MemoryPlan, LodeMiniMatchesItsTensorTable) {
  const gguf::Reader r(lode::test::mini_model_path());
  const model::Qwen35MoeConfig c = model::read_config(r.metadata());
  const model::ModelWeights w = model::bind_weights(r, c);
  for (const int64_t budget_mib : {64, 128, 1024})
    for (const int64_t context : {512, 1000, 4096}) {
      SCOPED_TRACE(std::to_string(budget_mib) + " MiB, context " + std::to_string(context));
      expect_plan_matches(r, w, {.budget = size_t(budget_mib) * kMiB, .kv = kv::Format::f16, .context = context});
    }
}

TEST(MemoryPlan, ThePromptChunkShrinksBeforeTheBudgetIsRefused) {
  const gguf::Reader r(lode::test::mini_model_path());
  const model::ModelWeights w = model::bind_weights(r, model::read_config(r.metadata()));
  const plan::PlanOptions wide{.budget = size_t(4096) * kMiB, .kv = kv::Format::f16, .context = 4096};
  const plan::MemoryPlan roomy = plan::plan_memory(w, wide);
  EXPECT_EQ(roomy.prompt_chunk, 4096);
  EXPECT_TRUE(roomy.all_resident());
  // A budget just short of the full chunk's scratch: the chunk halves until it fits, no expert left.
  plan::PlanOptions tight = wide;
  tight.budget = roomy.fixed() - 1;
  const plan::MemoryPlan shrunk = plan::plan_memory(w, tight);
  EXPECT_LT(shrunk.prompt_chunk, 4096);
  EXPECT_GE(shrunk.prompt_chunk, plan::kMinPromptChunk);
  EXPECT_LE(shrunk.used(), tight.budget);
  // Below the smallest chunk's needs: refused.
  tight.budget =
      plan::plan_memory(w, {.budget = size_t(4096) * kMiB, .kv = kv::Format::f16, .context = 4096, .prompt_chunk = 256})
          .fixed();
  tight.budget -= 1;
  EXPECT_THROW(plan::plan_memory(w, tight), BudgetShortfall);  // (a refusal callers can tell apart)
  // Prompts token by token need no prompt scratch at all.
  const plan::MemoryPlan none = plan::plan_memory(w, {.budget = size_t(4096) * kMiB, .context = 4096, .prompt_chunk = 0});
  EXPECT_EQ(none.prompt_scratch, 0u);
  EXPECT_EQ(none.prompt_chunk, 0);
}

TEST(MemoryPlan, ACapOnResidentExpertsIsKept) {
  const gguf::Reader r(lode::test::mini_model_path());
  const model::ModelWeights w = model::bind_weights(r, model::read_config(r.metadata()));
  const plan::MemoryPlan p = plan::plan_memory(
      w, {.budget = size_t(4096) * kMiB, .context = 1024, .max_resident_experts = 5});
  EXPECT_EQ(p.experts_resident, 5);
  EXPECT_EQ(p.expert_slots, 5 * p.slot_bytes);
  EXPECT_EQ(p.host_pinned, p.experts_host);
}

// The DeltaNet states: one set per sequence, and one set of a verify window's kept states (before
// each token but the first) however many sequences there are (none where windows take one token).
TEST(MemoryPlan, DeltaNetStatesCountSequencesAndOneWindow) {
  const gguf::Reader r(lode::test::mini_model_path());
  const model::ModelWeights w = model::bind_weights(r, model::read_config(r.metadata()));
  const auto states = [&](int64_t parallel, int64_t step_rows, int64_t window_rows) {
    return plan::plan_memory(w, {.budget = size_t(4096) * kMiB, .context = 1024, .parallel = parallel,
                                 .step_rows = step_rows, .window_rows = window_rows})
        .states;
  };
  const size_t one = states(1, 1, 0);
  ASSERT_GT(one, 0u);
  EXPECT_EQ(one, plan::state_bytes(w.config));
  EXPECT_EQ(states(4, 4, 1), 4 * one);      // steps of four sequences, no windows
  EXPECT_EQ(states(4, 4, 0), 7 * one);      // windows of up to step_rows: three kept
  EXPECT_EQ(states(1, 3, 3), 3 * one);      // one sequence, windows of 3
  EXPECT_EQ(states(16, 16, 3), 18 * one);   // sixteen sequences, windows of 3
}

// A pool shared by the sequences (kv_positions) holds its own positions' pages in every attention
// layer plus each sequence's page table, and what it saves against every sequence's whole context
// goes to experts; `lode plan --kv-positions` says so and refuses a pool outside [ctx, parallel x ctx].
TEST(MemoryPlan, ASharedKvPoolCountsItsOwnPositions) {
  const gguf::Reader r(lode::test::mini_model_path());
  const model::ModelWeights w = model::bind_weights(r, model::read_config(r.metadata()));
  const model::Qwen35MoeConfig& c = w.config;
  const plan::PlanOptions each{.budget = size_t(160) * kMiB, .context = 2048, .parallel = 8};
  plan::PlanOptions shared = each;
  shared.kv_positions = 4096;
  const plan::MemoryPlan whole = plan::plan_memory(w, each), pooled = plan::plan_memory(w, shared);
  EXPECT_EQ(whole.kv, 8 * plan::kv_bytes(c, kv::Format::f16, 2048));
  EXPECT_EQ(pooled.kv, size_t(c.n_full_attention_layers()) * plan::kv_layer_bytes(c, kv::Format::f16, 4096) +
                           8 * plan::kv_page_table_bytes(2048));
  EXPECT_LT(pooled.kv, whole.kv / 3);
  EXPECT_GE(pooled.experts_resident, whole.experts_resident);
  EXPECT_EQ(shared.kv_pool_positions(), 4096);
  EXPECT_EQ(each.kv_pool_positions(), 8 * 2048);

  const lode::test::TempDir dir;
  const std::string mini = lode::test::mini_model_path().string();
  const auto ok = lode::test::run_lode("plan -m '" + mini + "' --vram-budget 160 --ctx 2048 --parallel 8 --kv-positions 4096",
                                       dir.path());
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_NE(ok.out.find("4096 positions shared by 8 sequence(s) of up to 2048"), std::string::npos) << ok.out;
  // The decode scratch of steps of a row for each of the 8 sequences, as lode serve's session has.
  const double scratch_mib = double(plan::decode_scratch(c, 2048, 8, false).total) / double(kMiB);
  const size_t line = ok.out.find("decode scratch");
  ASSERT_NE(line, std::string::npos) << ok.out;
  EXPECT_NE(ok.out.substr(line, 60).find(fmt::format("{:.1f} MiB", scratch_mib)), std::string::npos) << ok.out;
  const auto small = lode::test::run_lode("plan -m '" + mini + "' --vram-budget 160 --ctx 2048 --parallel 8 --kv-positions 1000",
                                          dir.path());
  EXPECT_EQ(small.status, 1);
  EXPECT_NE(small.err.find("at least one sequence's context"), std::string::npos) << small.err;
}

// With --mtp the trunk holds the embedding table too (a verify step looks its rows up by token on
// the device), but not where the lm head is the table already, nor where the GPU cannot expand its
// type (the grid i-quants: nothing is armed then, and the table stays on the host).
TEST(MemoryPlan, MtpCountsTheEmbeddingTableWhereTheGpuLooksItsRowsUp) {
  const gguf::Reader r(lode::test::mini_model_path());
  const model::ModelWeights w = model::bind_weights(r, model::read_config(r.metadata()));
  ASSERT_TRUE(w.mtp.has_value());
  ASSERT_NE(w.token_embd.data, w.output.data) << "lode-mini's lm head is its own matrix";
  ASSERT_TRUE(cuda::expandable(w.token_embd.type->type, w.token_embd.cols)) << w.token_embd.type->name;
  const size_t table = size_t(w.token_embd.rows) * w.token_embd.row_bytes;
  model::ModelWeights grid = w, tied = w;
  grid.token_embd.type = &traits(GgmlType::IQ2_XXS);
  tied.output = tied.token_embd;
  EXPECT_EQ(plan::mtp_trunk_bytes(grid) + table, plan::mtp_trunk_bytes(w));
  EXPECT_EQ(plan::mtp_trunk_bytes(tied) + table, plan::mtp_trunk_bytes(w));
}

// `lode plan --mtp N` plans what lode serve's drafts hold: the MTP block in the trunk, its K/V cache
// of every sequence, and the DeltaNet states of --mtp-sequences windows of N + 1 (lode serve's
// default on the GPU: 4, or --parallel where fewer); a file without the block, or --mtp-sequences
// beyond --parallel or without --mtp, is refused saying so.
TEST(MemoryPlan, TheCommandPlansDraftsWithMtp) {
  const gguf::Reader r(lode::test::mini_model_path());
  const model::ModelWeights w = model::bind_weights(r, model::read_config(r.metadata()));
  ASSERT_TRUE(w.mtp.has_value());
  const plan::PlanOptions plain{.budget = size_t(160) * kMiB, .context = 2048, .parallel = 8, .step_rows = 8,
                                .window_rows = 1};
  plan::PlanOptions drafting = plain;
  drafting.mtp = true, drafting.window_rows = 4 * 3, drafting.step_rows = 12;  // 4 sequences' windows of 3
  const plan::MemoryPlan without = plan::plan_memory(w, plain), with = plan::plan_memory(w, drafting);
  EXPECT_EQ(with.trunk, without.trunk + plan::mtp_trunk_bytes(w));
  EXPECT_EQ(with.kv, without.kv + 8 * plan::mtp_kv_bytes(w.config, kv::Format::f16, 2048));
  EXPECT_EQ(with.states, plan::state_bytes(w.config, 12, 8));
  EXPECT_GT(with.states, without.states);

  const lode::test::TempDir dir;
  const std::string plan = "plan -m '" + lode::test::mini_model_path().string() + "' --vram-budget 160 --ctx 2048 --parallel 8";
  const auto mib_in = [](const std::string& out, const std::string& what, size_t bytes) {
    const size_t line = out.find(what);
    return line != std::string::npos &&
           out.substr(line, 60).find(fmt::format("{:.1f} MiB", double(bytes) / double(kMiB))) != std::string::npos;
  };
  const auto r2 = lode::test::run_lode(plan + " --mtp 2", dir.path());
  ASSERT_EQ(r2.status, 0) << r2.err;
  EXPECT_TRUE(mib_in(r2.out, "trunk", with.trunk)) << r2.out;
  EXPECT_TRUE(mib_in(r2.out, "K/V cache", with.kv)) << r2.out;
  EXPECT_TRUE(mib_in(r2.out, "DeltaNet states", with.states)) << r2.out;
  EXPECT_NE(r2.out.find("kept for 12 rows of verify windows"), std::string::npos) << r2.out;
  EXPECT_NE(r2.out.find("the MTP block's of each sequence"), std::string::npos) << r2.out;
  const auto one = lode::test::run_lode(plan + " --mtp 2 --mtp-sequences 1", dir.path());
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_NE(one.out.find("kept for 3 rows of verify windows"), std::string::npos) << one.out;
  // Held to --parallel, as lode serve holds it; past what a step's rows hold, refused.
  const auto past = lode::test::run_lode(plan + " --mtp 2 --mtp-sequences 9", dir.path());
  ASSERT_EQ(past.status, 0) << past.err;
  EXPECT_NE(past.out.find("kept for 24 rows of verify windows"), std::string::npos) << past.out;
  const std::string plan32 =
      "plan -m '" + lode::test::mini_model_path().string() + "' --vram-budget 160 --ctx 2048 --parallel 32";
  const auto beyond = lode::test::run_lode(plan32 + " --mtp 2 --mtp-sequences 30", dir.path());
  EXPECT_EQ(beyond.status, 1);
  EXPECT_NE(beyond.err.find("--mtp-sequences 30 with --mtp 2: a GPU step holds the windows of 1 to 21 sequences"),
            std::string::npos)
      << beyond.err;
  const auto alone = lode::test::run_lode(plan + " --mtp-sequences 2", dir.path());
  EXPECT_EQ(alone.status, 1);
  EXPECT_NE(alone.err.find("--mtp-sequences goes with --mtp N"), std::string::npos) << alone.err;
  model::SynthOptions o;
  o.layers = 4;
  model::write_synth(dir.path() / "no-mtp.gguf", o);
  const auto missing = lode::test::run_lode(
      "plan -m '" + (dir.path() / "no-mtp.gguf").string() + "' --vram-budget 160 --ctx 256 --mtp 1", dir.path());
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("--mtp: "), std::string::npos) << missing.err;
}

TEST(MemoryPlan, HostRamTooSmallIsRefusedClearly) {
  EXPECT_NO_THROW(plan::check_host_ram(size_t(1) << 20));
  try {
    plan::check_host_ram(size_t(1) << 50);  // a petabyte of experts
    ADD_FAILURE() << "a petabyte of pinned host memory was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("short by"), std::string::npos) << err.what();
  }
}

TEST(MemoryPlan, TheCommandPrintsThePlanAndEachFormat) {
  const lode::test::TempDir dir;
  const std::string mini = lode::test::mini_model_path().string();
  const auto r = lode::test::run_lode("plan -m '" + mini + "' --vram-budget 64 --ctx 2048", dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* line : {"trunk", "K/V cache", "prompt scratch", "experts in VRAM", "host RAM", "q4 ", "k8v4 "})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " in " << r.out;
  const auto short_budget = lode::test::run_lode("plan -m '" + mini + "' --vram-budget 1 --ctx 2048", dir.path());
  EXPECT_EQ(short_budget.status, 1);
  EXPECT_NE(short_budget.err.find("short by"), std::string::npos) << short_budget.err;
}

}  // namespace
