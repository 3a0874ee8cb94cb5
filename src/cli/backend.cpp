#include "cli/backend.h"

#include <CLI/CLI.hpp>

#include <algorithm>

#include "cli/expert_profile.h"
#include "cli/validators.h"
#include "core/error.h"
#include "plan/memory_plan.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#ifdef LODE_HAVE_CUDA
#include "cuda/device.h"
#include "cuda/engine.h"
#include "cuda/vram.h"
#endif

namespace lode::cli {

void add_vram_budget_option(CLI::App& cmd, int64_t& mib) {
  cmd.add_option("--vram-budget", mib,
                 "MiB of GPU memory lode may use (default: what is free, less 5% or 512 MiB); a model that does "
                 "not fit is refused, saying by how much")
      ->check(integer_at_least(0));
}

void add_backend_options(CLI::App& cmd, BackendOptions& o) {
  cmd.add_option("--backend", o.backend,
                 "auto (default: the GPU when there is one, else the CPU), cpu, or cuda: the whole model on the GPU "
                 "(--ctx defaults to at most 8192 there; --threads and --chunk are the CPU engine's)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  add_vram_budget_option(cmd, o.vram_budget_mib);
  cmd.add_option("--gpus", o.gpus,
                 "GPUs to spread the model's layers over, by CUDA index (e.g. 0,1; default: GPU 0 alone, or every "
                 "GPU when there are several and GPU 0 cannot hold every expert): each holds a share of the layers "
                 "with their K/V and as many of their experts as its --vram-budget holds");
  add_expert_profile_option(cmd, o.expert_profile);
  add_expert_swaps_option(cmd, o.expert_swaps);
  add_miss_path_option(cmd, o.miss_path);
}

std::vector<int> parse_gpus(const std::string& list) {
  std::vector<int> gpus;
  size_t at = 0;
  for (;;) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, comma - at);
    if (item.empty() || item.size() > 4 || !std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }))
      fail("--gpus {}: give CUDA device indices separated by commas, e.g. --gpus 0,1", list);
    gpus.push_back(std::stoi(item));
    if (comma == list.size()) return gpus;
    at = comma + 1;
  }
}

int64_t gpu_draft_sequences(int64_t mtp, int64_t sequences) {
  return std::max<int64_t>(1, std::min({kGpuDraftSequences, sequences, kGpuStepRows / (mtp + 1)}));
}

int64_t gpu_draft_sequences(int64_t mtp, int64_t sequences, int64_t asked) {
  const int64_t drafting = std::min(asked, sequences);
  if (drafting < 1 || drafting * (mtp + 1) > kGpuStepRows)
    fail("--mtp-sequences {} with --mtp {}: a GPU step holds the windows of 1 to {} sequences ({} rows of {} tokens)",
         asked, mtp, kGpuStepRows / (mtp + 1), kGpuStepRows, mtp + 1);
  return drafting;
}

namespace {

#ifdef LODE_HAVE_CUDA
// The run log's lines for the GPU engine: the K/V cache and the budget left, the memory plan and
// the host tier; on several GPUs, each one's share.
void log_gpu_engine(const cuda::CudaPipeline& pipeline, const model::Qwen35MoeConfig& config,
                    const cuda::CudaSessionOptions& options, const GpuRun& run) {
  const std::string shared =
      options.kv_positions > 0
          ? fmt::format(" for each of {} sequences, sharing {} positions", run.sequences, options.kv_positions)
          : run.sequences > 1 ? fmt::format(" for each of {} sequences", run.sequences) : std::string();
  size_t budget = 0, held = 0;
  bool all_resident = true;
  for (size_t g = 0; g < pipeline.shares(); ++g) {
    budget += pipeline.share(g).vram().budget(), held += pipeline.share(g).vram().held();
    all_resident = all_resident && pipeline.share(g).plan().all_resident();
  }
  fmt::print(stderr, "lode: K/V cache {}{} of VRAM{}; {:.1f} MiB of the {:.1f} MiB budget left\n",
             describe_kv(config, options.kv_format, options.max_context), shared,
             pipeline.shares() > 1 ? fmt::format(", in {} shares of the layers", pipeline.shares()) : std::string(),
             double(budget - held) / double(1 << 20), double(budget) / double(1 << 20));
  const cuda::ExpertStats stats = pipeline.expert_stats();
  fmt::print(stderr, "lode: {}; experts in host RAM: {}\n", pipeline.describe(), stats.host_tier);
  if (!all_resident) fmt::print(stderr, "lode: decode misses: {}\n", stats.miss_path);
}

// Without --gpus: GPU 0 alone, or every visible GPU where there are several and GPU 0 cannot hold
// every expert (its plan for the budget leaves some in host RAM, or refuses the model; with the
// MTP block counted). Says so when it spreads the layers.
std::vector<int> default_gpus(const model::ModelWeights& weights, const cuda::CudaSessionOptions& options) {
  if (cuda::count_devices() < 2) return {0};
  const std::vector<cuda::DeviceInfo> devices = cuda::list_devices(nullptr);
  if (devices.size() < 2) return {0};
  const size_t budget = options.vram_budget > 0 ? options.vram_budget
                                                : plan::default_budget(devices[0].free_bytes, devices[0].total_bytes);
  try {
    if (plan::plan_memory(weights, cuda::plan_options(options, budget)).all_resident()) return {0};
  } catch (const Error&) {  // (GPU 0 alone cannot hold the model at all)
  }
  std::vector<int> all;
  for (const cuda::DeviceInfo& d : devices) all.push_back(d.index);
  fmt::print(stderr, "lode: GPU 0 cannot hold every expert of this model; its layers go over all {} GPUs (--gpus 0 "
             "keeps to one)\n", all.size());
  return all;
}
#endif

std::unique_ptr<engine::Sequence> open_gpu_sequence(const BackendOptions& o, LoadedModel& model,
                                                    const ModelRunOptions& run, int64_t mtp) {
  const GpuRun gpu{.ctx = gpu_context(model.config, run.ctx),
                   .activations = run.activations_or(model::Activations::q8),
                   .kv_format = run.kv_format(),
                   .mtp = mtp};
  return open_gpu_model(o, model.reader, model.config, model.weights, gpu)->open_sequence();
}

}  // namespace

std::shared_ptr<engine::Model> open_gpu_model(const BackendOptions& o, const gguf::Reader& reader,
                                              const model::Qwen35MoeConfig& config,
                                              std::shared_ptr<const model::ModelWeights> weights, const GpuRun& run) {
#ifdef LODE_HAVE_CUDA
  cuda::CudaSessionOptions options;
  options.max_context = run.ctx;
  options.vram_budget = size_t(o.vram_budget_mib) << 20;
  options.activations = run.activations;
  options.kv_format = run.kv_format;
  if (!o.expert_profile.empty()) options.expert_scores = expert_scores_from(o.expert_profile, *weights);
  options.swaps.enabled = o.expert_swaps == "on";
  options.miss_path = miss_path_from(o.miss_path);
  options.mtp = run.mtp > 0;
  static_assert(kGpuStepRows == cuda::kMaxStepRows);
  if (run.sequences < 1 || run.sequences > cuda::kMaxStepRows)
    fail("--parallel {}: the GPU runs 1 to {} sequences in one step", run.sequences, cuda::kMaxStepRows);
  options.sequences = run.sequences;
  if (run.kv_positions > 0 && (run.kv_positions < run.ctx || run.kv_positions > run.sequences * run.ctx))
    fail("--kv-positions {}: give at least one sequence's context ({}) and at most --parallel x --ctx ({})",
         run.kv_positions, run.ctx, run.sequences * run.ctx);
  options.kv_positions = run.kv_positions == run.sequences * run.ctx ? 0 : run.kv_positions;
  if (run.mtp > 0) gpu_draft_sequences(run.mtp, run.draft_sequences, run.draft_sequences);  // (fails outside 1..)
  // (1 without drafts: nothing kept)
  options.window_rows = run.mtp > 0 ? run.draft_sequences * (run.mtp + 1) : 1;
  options.step_rows = std::max(options.window_rows, run.sequences);
  const std::vector<int> gpus = o.gpus.empty() ? default_gpus(*weights, options) : parse_gpus(o.gpus);
  std::unique_ptr<cuda::CudaPipeline> pipeline;
  try {
    pipeline = std::make_unique<cuda::CudaPipeline>(reader, std::move(weights), options, gpus);
  } catch (const BudgetShortfall& e) {  // (several GPUs may hold it)
    if (gpus.size() > 1 || cuda::count_devices() < 2) throw;
    fail("{}; or spread the layers over this machine's {} GPUs (--gpus 0,1,...)", e.what(), cuda::count_devices());
  }
  log_gpu_engine(*pipeline, config, options, run);
  return std::make_shared<cuda::CudaModel>(std::move(pipeline));
#else
  (void)o, (void)reader, (void)config, (void)weights, (void)run;
  fail("--backend cuda: this lode was built without CUDA (configure with LODE_CMAKE_ARGS=-DLODE_CUDA=ON)");
#endif
}

int64_t gpu_context(const model::Qwen35MoeConfig& config, int64_t asked) {
  return asked > 0 ? asked : std::min<int64_t>(config.context_length, 8192);
}

std::string first_gpu() {
#ifdef LODE_HAVE_CUDA
  return cuda::first_device_name();
#else
  return {};
#endif
}

std::string describe_kv(const model::Qwen35MoeConfig& config, kv::Format format, int64_t positions) {
  return kv::describe(format, config.n_full_attention_layers(), config.n_kv_heads, config.head_dim, positions);
}

std::string resolve_backend(const BackendOptions& o) {
  if (o.backend != "auto") return o.backend;
  return first_gpu().empty() ? "cpu" : "cuda";
}

void note_gpu_options_unused(const BackendOptions& o) {
  std::vector<std::string> given;
  if (o.vram_budget_mib != 0) given.push_back("--vram-budget");
  if (!o.gpus.empty()) given.push_back("--gpus");
  if (!o.expert_profile.empty()) given.push_back("--expert-profile");
  if (o.expert_swaps != BackendOptions{}.expert_swaps) given.push_back("--expert-swaps");
  if (o.miss_path != BackendOptions{}.miss_path) given.push_back("--miss-path");
  if (!given.empty())
    fmt::print(stderr, "lode: {} {} the GPU engine's; the CPU engine runs without {}\n", fmt::join(given, ", "),
               given.size() == 1 ? "is" : "are", given.size() == 1 ? "it" : "them");
}

namespace {

std::unique_ptr<engine::Sequence> open_cpu_sequence(const BackendOptions& o, LoadedModel& model) {
  note_gpu_options_unused(o);
  std::unique_ptr<engine::Sequence> sequence = model.cpu_model()->open_sequence();
  fmt::print(stderr, "lode: K/V cache {} at most (RAM, as the context fills)\n",
             describe_kv(model.config, model.cpu_options().kv_format, sequence->max_context()));
  return sequence;
}

}  // namespace

std::unique_ptr<engine::Sequence> open_sequence(const BackendOptions& o, LoadedModel& model,
                                                const ModelRunOptions& run, int64_t mtp) {
  if (o.backend == "cpu") return open_cpu_sequence(o, model);
  if (o.backend == "cuda") return open_gpu_sequence(o, model, run, mtp);
  const std::string gpu = first_gpu();  // auto
  if (gpu.empty()) return open_cpu_sequence(o, model);
  try {
    auto sequence = open_gpu_sequence(o, model, run, mtp);
    fmt::print(stderr, "lode: on the GPU ({}); --backend cpu for the CPU engine\n", gpu);
    return sequence;
  } catch (const Error& e) {
    // A type without GPU kernels, a model larger than the budget, a GPU this build has no code for.
    fmt::print(stderr, "lode: the GPU ({}) cannot run this model ({}); on the CPU engine instead (--backend cuda to "
               "insist)\n", gpu, e.what());
    return open_cpu_sequence(o, model);
  }
}

}  // namespace lode::cli
