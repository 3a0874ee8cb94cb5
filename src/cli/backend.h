// The engine a command runs on, the one place that names a backend: the CPU engine on a loaded
// model's weights, or the CUDA engine (`--backend cpu|cuda`, `--vram-budget MiB`), both behind
// engine/engine.h so that generation drives them alike. Used by `lode run`, `lode chat`, `lode ppl`
// and `lode serve`.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/loaded_model.h"
#include "cli/model_options.h"
#include "engine/engine.h"

namespace CLI {
class App;
}

namespace lode::cli {

struct BackendOptions {
  std::string backend = "auto";  // auto: the GPU when lode has CUDA and a GPU is visible, else the CPU
  int64_t vram_budget_mib = 0;  // 0: what the GPU has free, less a margin
  std::string expert_profile;   // a routing profile placing experts in VRAM (empty: an even spread)
  std::string expert_swaps = "on";  // on: adaptive placement between decode steps; off: frozen
  std::string miss_path = "auto";   // who computes decode misses (--miss-path)
  std::string gpus;  // --gpus 0,1,...: the GPUs the layers are spread over (empty: the default, below)
};

// --gpus' list of CUDA device indices ("0,1,3"); fails clearly on anything else.
std::vector<int> parse_gpus(const std::string& list);

// The K/V cache line of the run log: format, bytes per cell, bytes for `positions`.
std::string describe_kv(const model::Qwen35MoeConfig& config, kv::Format format, int64_t positions);
// "cpu" or "cuda" for o.backend, resolving "auto".
std::string resolve_backend(const BackendOptions& o);

// On the CPU engine: says on stderr which of the GPU's options were given, since the CPU engine
// does not use them (--vram-budget, --gpus, --expert-profile, --expert-swaps, --miss-path).
void note_gpu_options_unused(const BackendOptions& o);
// Adds --backend, --vram-budget, --gpus, --expert-profile, --expert-swaps and --miss-path to a command.
void add_backend_options(CLI::App& cmd, BackendOptions& o);
// Adds --vram-budget alone (lode bench, which is always on the GPU).
void add_vram_budget_option(CLI::App& cmd, int64_t& mib);

// The first visible GPU's name, or empty when there is none (or no CUDA in this build).
std::string first_gpu();

// The positions of K/V a GPU session keeps: `asked` (--ctx), else the model's context up to 8192
// (the pool of pages is allocated up front on the GPU).
int64_t gpu_context(const model::Qwen35MoeConfig& config, int64_t asked);

// The most rows one GPU step takes (sequences' tokens and their verify windows together).
inline constexpr int64_t kGpuStepRows = 64;

// With --mtp N on the GPU, the sequences that draft while they decode, their verify windows in one
// step (lode serve --mtp-sequences' default): kGpuDraftSequences, or fewer where `sequences`
// (--parallel) or a step's rows hold fewer windows of N + 1. On an H100 with the 35B synth (lode
// bench --sequence-windows 2, drafting timed), 4 sequences' windows with their drafts would decode
// 1.06x / 1.19x / 1.25x faster at acceptance 0.6 / 0.8 / 0.9, as one sequence's alone (1.04x /
// 1.16x / 1.23x), and 16 sequences' 0.97x / 1.09x / 1.16x; served on lode-mini, whose steps are too
// short for drafts to pay at all, 4 cost no more than 1 (docs/MTP.md, stops 79 and 80).
inline constexpr int64_t kGpuDraftSequences = 4;
int64_t gpu_draft_sequences(int64_t mtp, int64_t sequences);
// The sequences whose windows a GPU step holds with --mtp-sequences `asked` (held to `sequences`,
// --parallel, as lode serve holds it); fails, saying the range, where one step cannot hold them.
int64_t gpu_draft_sequences(int64_t mtp, int64_t sequences, int64_t asked);

// What the GPU engine is made for: K/V for ctx positions, decode's products' activations, the
// K/V format.
struct GpuRun {
  int64_t ctx = 0;
  model::Activations activations = model::Activations::q8;
  kv::Format kv_format = kv::Format::f16;
  int64_t mtp = 0;  // drafts per verify step (--mtp): the MTP block on the GPU, verify windows of mtp + 1
  // Sequences whose verify windows one step holds (lode serve --mtp-sequences): the DeltaNet states
  // kept for draft_sequences x (mtp + 1) rows.
  int64_t draft_sequences = 1;
  int64_t sequences = 1;  // sequences held at once, each ctx positions (lode serve --parallel)
  int64_t kv_positions = 0;  // positions of K/V they share (lode serve --kv-positions; 0: ctx each)
};
// The CUDA engine on these weights (the budget, expert placement and miss path from `o`), its
// VRAM plan on stderr. Fails as open_sequence does on the GPU.
std::shared_ptr<engine::Model> open_gpu_model(const BackendOptions& o, const gguf::Reader& reader,
                                              const model::Qwen35MoeConfig& config,
                                              std::shared_ptr<const model::ModelWeights> weights, const GpuRun& run);

// The sequence on the chosen backend (auto: a line on stderr says when that is the GPU). On the
// GPU, K/V is kept for run.ctx positions (0: the
// model's context, at most 8192), and decode's products follow run's --activations (default q8).
// Fails clearly when lode was built without CUDA, there is no usable GPU, or the budget is too
// small (saying by how many MiB). With mtp > 0 (--mtp) the GPU holds the MTP block and verify
// windows of mtp + 1 tokens.
std::unique_ptr<engine::Sequence> open_sequence(const BackendOptions& o, LoadedModel& model,
                                                const ModelRunOptions& run, int64_t mtp = 0);

}  // namespace lode::cli
