// `lode plan -m MODEL [--vram-budget MiB] [--kv F] [--ctx N] [--parallel N] [--kv-positions N] [--prompt-chunk N] [--gpus N] [--mtp N [--mtp-sequences S]] [--expert-profile FILE]`:
// how the GPU session would spend a VRAM budget on a model (plan/memory_plan.h), computed from the
// file alone, and for each K/V format how many experts the same budget would keep in VRAM; with
// --gpus N above 1, how N GPUs of that budget each would share it (plan/gpu_split.h: their layers,
// their experts, none on two; which experts, by a routing profile's counts when given); with --mtp N,
// what lode run and lode serve add for drafts (the MTP block, its K/V cache, the DeltaNet states a
// verify window keeps: --mtp-sequences windows of N + 1, as lode serve's default). Needs no GPU
// when --vram-budget is given; without it, the first GPU's free memory less a margin.
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "cli/backend.h"
#include "cli/commands.h"
#include "cli/expert_profile.h"
#include "cli/model_options.h"
#include "cli/validators.h"
#include "core/error.h"
#include "gguf/reader.h"
#include "model/qwen35moe.h"
#include "model/weights.h"
#include "plan/gpu_split.h"
#include "plan/memory_plan.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/device.h"
#endif

namespace lode::cli {
namespace {

struct PlanCommandOptions {
  std::string model;
  int64_t vram_budget_mib = 0;
  std::string kv;
  int64_t ctx = 0;
  int64_t parallel = 1;
  int64_t prompt_chunk = 4096;
  int64_t gpus = 1;
  int64_t kv_positions = 0;  // --kv-positions (0: --parallel x --ctx)
  int64_t mtp = 0;           // --mtp: drafts a verify window holds (0: none)
  std::optional<int64_t> mtp_sequences;  // --mtp-sequences (unset: lode serve's default on the GPU)
  std::string expert_profile;  // --expert-profile: which experts go to VRAM first
};

// The budget asked for, or the first GPU's default one.
size_t budget_bytes(int64_t mib) {
  if (mib > 0) return size_t(mib) << 20;
#ifdef LODE_HAVE_CUDA
  std::string why;
  const auto devices = cuda::list_devices(&why);
  if (!devices.empty()) {
    fmt::print("budget: {} has {:.1f} MiB free of {:.1f} MiB; lode's default budget keeps a margin\n",
               devices.front().name, double(devices.front().free_bytes) / double(1 << 20),
               double(devices.front().total_bytes) / double(1 << 20));
    return plan::default_budget(devices.front().free_bytes, devices.front().total_bytes);
  }
  fail("no GPU to read a default budget from ({}): give --vram-budget MiB", why);
#else
  fail("this lode was built without CUDA, so there is no GPU to read a default budget from: give --vram-budget MiB");
#endif
}

// The share of a profile's routings that go to the experts in VRAM (held[i]: expert i is).
double routed_share(const std::vector<double>& scores, const std::vector<bool>& held) {
  double all = 0, in_vram = 0;
  for (size_t i = 0; i < scores.size(); ++i) all += scores[i], in_vram += held[i] ? scores[i] : 0.0;
  return all > 0 ? in_vram / all : 0.0;
}

void run_plan(const PlanCommandOptions& o) {
  const gguf::Reader reader(o.model);
  const model::Qwen35MoeConfig config = model::read_config(reader.metadata());
  const model::ModelWeights weights = model::bind_weights(reader, config);
  plan::PlanOptions options;
  options.budget = budget_bytes(o.vram_budget_mib);
  options.kv = chosen_kv_format(o.kv);
  options.context = gpu_context(config, o.ctx);
  options.parallel = o.parallel;
  // As lode serve runs them: a step takes a row of each sequence; with --mtp, the windows of
  // --mtp-sequences of them too, whose DeltaNet states before each token but the first it keeps.
  options.step_rows = o.parallel;
  options.window_rows = 1;
  if (o.mtp > 0) {
    if (!weights.mtp) fail("--mtp: {}", weights.mtp_unavailable);
    const int64_t drafting = o.mtp_sequences ? gpu_draft_sequences(o.mtp, o.parallel, *o.mtp_sequences)
                                             : gpu_draft_sequences(o.mtp, o.parallel);
    options.mtp = true;
    options.window_rows = drafting * (o.mtp + 1);
    options.step_rows = std::max(options.step_rows, options.window_rows);
  } else if (o.mtp_sequences) {
    fail("--mtp-sequences goes with --mtp N");
  }
  options.prompt_chunk = o.prompt_chunk;
  if (o.kv_positions > 0) {
    if (o.kv_positions < options.context || o.kv_positions > o.parallel * options.context)
      fail("--kv-positions {}: give at least one sequence's context ({}) and at most --parallel x --ctx ({})",
           o.kv_positions, options.context, o.parallel * options.context);
    options.kv_positions = o.kv_positions == o.parallel * options.context ? 0 : o.kv_positions;
  }
  fmt::print("model: {} ({} layers, {} experts per layer, top {})\n", o.model, config.n_layers, config.n_experts,
             config.n_experts_used);
  const std::vector<double> scores =
      o.expert_profile.empty() ? std::vector<double>{} : expert_scores_from(o.expert_profile, weights);
  if (o.gpus > 1) {
    const plan::GpuSplit split =
        plan::split_over_gpus(weights, options, std::vector<size_t>(size_t(o.gpus), options.budget), scores);
    fmt::print("{} GPUs of {:.1f} MiB each, K/V for {} ({}):\n{}", o.gpus, double(options.budget) / double(1 << 20),
               plan::kv_note(options),
               scores.empty() ? "experts spread evenly; no routing profile"
                              : "the most routed experts first, by the profile " + o.expert_profile,
               plan::describe(split));
    if (!scores.empty()) {
      std::vector<bool> held(scores.size());
      for (size_t i = 0; i < held.size(); ++i) held[i] = split.owner[i] >= 0;
      fmt::print("the experts in VRAM take {:.1f}% of the profile's routings\n", 100.0 * routed_share(scores, held));
    }
    return;
  }
  const plan::MemoryPlan chosen = plan::plan_memory(weights, options);
  fmt::print("{}", plan::describe(chosen));
  if (!scores.empty()) {  // the session places the most routed first
    std::vector<size_t> order(scores.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
    std::vector<bool> held(scores.size());
    for (int64_t r = 0; r < chosen.experts_resident; ++r) held[order[size_t(r)]] = true;
    fmt::print("the experts in VRAM, the profile's most routed, take {:.1f}% of its routings\n",
               100.0 * routed_share(scores, held));
  }
  fmt::print("the same budget and context in each K/V format:\n");
  for (kv::Format format : kv::all_formats()) {
    if (!kv::unsupported_reason(format, config.head_dim).empty()) continue;
    plan::PlanOptions other = options;
    other.kv = format;
    try {
      const plan::MemoryPlan p = plan::plan_memory(weights, other);
      fmt::print("  {:<6} K/V {:9.1f} MiB  experts in VRAM {:>6} of {} ({:5.1f}%)\n", kv::to_string(format),
                 double(p.kv) / double(1 << 20), p.experts_resident, p.experts_total, 100.0 * p.resident_fraction());
    } catch (const Error&) {
      fmt::print("  {:<6} does not fit\n", kv::to_string(format));
    }
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanCommandOptions>();
  auto* cmd = app.add_subcommand("plan", "How a VRAM budget would be spent on a model: trunk, K/V, scratch, experts");
  cmd->add_option("-m,--model", o->model, "GGUF model (for a split model: its first file)")->required();
  cmd->add_option("--vram-budget", o->vram_budget_mib,
                  "MiB of GPU memory to plan for (default: what the first GPU has free, less 5% or 512 MiB)")
      ->check(integer_at_least(1));
  add_kv_option(*cmd, o->kv);
  cmd->add_option("--ctx", o->ctx, "Positions of K/V per sequence (default: the model's context, at most 8192)")
      ->check(integer_at_least(1));
  cmd->add_option("--parallel", o->parallel, "Sequences held at once, each with its K/V and states (default 1)")
      ->check(integer_at_least(1));
  cmd->add_option("--kv-positions", o->kv_positions,
                  "Positions of K/V the sequences share, as lode serve --kv-positions (default --parallel x --ctx)")
      ->check(integer_at_least(1));
  cmd->add_option("--prompt-chunk", o->prompt_chunk,
                  "Prompt tokens per pass wanted (default 4096; halved while the budget cannot hold it)")
      ->check(CLI::Range(int64_t(1), int64_t(65535)));
  cmd->add_option("--gpus", o->gpus,
                  "Plan for this many GPUs of one host, each with the budget: their layers and experts (default 1)")
      ->check(CLI::Range(int64_t(1), int64_t(1024)));
  cmd->add_option("--mtp", o->mtp,
                  "Plan for drafts of up to N tokens (lode run / lode serve --mtp): the MTP block, its K/V cache "
                  "of every sequence, and the DeltaNet states kept for verify windows (default 0: none)")
      ->check(CLI::Range(int64_t(0), int64_t(16)));
  cmd->add_option("--mtp-sequences", o->mtp_sequences,
                  "With --mtp: the sequences whose windows one step verifies, as lode serve --mtp-sequences "
                  "(held to --parallel as there; default as lode serve's on the GPU: 4, or --parallel where fewer)")
      ->check(integer_at_least(1));
  add_expert_profile_option(*cmd, o->expert_profile);
  cmd->callback([o] { run_plan(*o); });
}

}  // namespace lode::cli
