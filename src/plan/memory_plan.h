// One memory plan: how a VRAM budget is spent on a model, computed from the file alone (no GPU).
// The order is fixed: the trunk (every tensor but the routed experts, as the GPU holds it, with
// the device-side expert tables), the K/V cache for the context in its format (per sequence), the
// DeltaNet states (per sequence), the decode step's scratch, the prompt pass's scratch (its chunk
// halves while the budget cannot hold it, down to kMinPromptChunk), then whole experts (gate, up
// and down of one (layer, expert)) in equal slots until the budget is spent. Every expert stays in
// host RAM as stored (pinned, so the GPU reads the absent ones over PCIe). The CUDA session
// allocates exactly these figures; `lode plan` prints them.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kv/format.h"
#include "model/weights.h"
#include "plan/scratch.h"

namespace lode::plan {

// The smallest prompt chunk a plan settles for when the budget is tight (a smaller budget is
// refused; with prompt_chunk 0 prompts run token by token and need no prompt scratch).
constexpr int64_t kMinPromptChunk = 256;

struct PlanOptions {
  size_t budget = 0;          // bytes of VRAM to spend
  kv::Format kv = kv::Format::f16;
  int64_t context = 4096;     // positions of K/V per sequence
  int64_t parallel = 1;       // sequences held at once (K/V and DeltaNet states each)
  // Positions of K/V the sequences share, as pages they take while they write (0: each sequence
  // its whole context, parallel x context).
  int64_t kv_positions = 0;
  int64_t kv_pool_positions() const { return kv_positions > 0 ? kv_positions : std::max<int64_t>(parallel, 1) * context; }
  int64_t step_rows = 1;      // rows one decode step takes at most (a verify window's tokens, or sequences)
  // Tokens a verify window takes at most, whose DeltaNet states before each but the first it keeps
  // (0: step_rows).
  int64_t window_rows = 0;
  int64_t kept_rows() const { return window_rows > 0 ? window_rows : step_rows; }
  bool mtp = false;           // the MTP block on the GPU too (speculative decoding's drafter)
  // Whether this GPU holds the output norm and the lm head. Without them it is one share of the
  // layers on several GPUs that hands its rows on (cuda/pipeline.h), holding the next layer's
  // norm instead.
  bool head = true;
  int64_t prompt_chunk = 4096;  // tokens per prompt pass wanted (0: prompts run token by token)
  // At most this many experts in VRAM (-1: as many as the budget holds); tests and benchmarks
  // use it to place a given share of the experts.
  int64_t max_resident_experts = -1;
};

// The bytes of one expert of one layer, as stored.
struct ExpertBytes {
  size_t gate = 0, up = 0, down = 0;
  size_t total() const { return gate + up + down; }
};

struct MemoryPlan {
  PlanOptions options;
  size_t trunk = 0;            // non-expert weights and the expert tables
  size_t kv = 0;               // K/V cache, all sequences
  size_t states = 0;           // DeltaNet conv and recurrent states, all sequences
  size_t decode_scratch = 0;
  size_t prompt_scratch = 0;
  int64_t prompt_chunk = 0;    // after shrinking to fit (0: token by token)
  std::vector<ExpertBytes> expert_bytes;  // per layer
  size_t slot_bytes = 0;       // one VRAM slot: the largest expert of any layer
  int64_t experts_total = 0;   // layers x experts per layer
  int64_t experts_resident = 0;
  size_t expert_slots = 0;     // experts_resident x slot_bytes
  size_t experts_host = 0;     // every expert as stored: the host tier
  size_t host_pinned = 0;      // pinned host RAM the plan needs (0 when every expert is resident)

  size_t fixed() const { return trunk + kv + states + decode_scratch + prompt_scratch; }
  size_t used() const { return fixed() + expert_slots; }
  double resident_fraction() const {
    return experts_total > 0 ? double(experts_resident) / double(experts_total) : 1.0;
  }
  bool all_resident() const { return experts_resident == experts_total; }
};

// The budget when none is given: what the device has free, less a margin (512 MiB, or 5% of the
// device when larger) for the CUDA context, cuBLAS workspaces and other processes.
size_t default_budget(size_t free_bytes, size_t total_bytes);

// The plan for a budget. Fails (lode::Error) when the budget cannot hold the trunk, the K/V cache,
// the states and the scratch at the smallest prompt chunk, saying how many MiB are short and what
// would fit instead (a smaller --ctx, a smaller --kv format).
MemoryPlan plan_memory(const model::ModelWeights& weights, const PlanOptions& options);

// The trunk as the GPU holds it (bytes), and the pieces plan_memory sums (for tests); by layer,
// for a plan over several GPUs (plan/gpu_split.h): trunk = head + every layer's share, K/V = each
// attention layer's cells + the page table, states = each DeltaNet layer's.
size_t trunk_bytes(const model::ModelWeights& weights);
size_t head_bytes(const model::ModelWeights& weights);  // the output norm and the lm head
// What a share of the layers that hands its rows on holds instead of the head: the next layer's norm.
size_t hand_on_bytes(const model::Qwen35MoeConfig& config);
size_t layer_trunk_bytes(const model::ModelWeights& weights, size_t layer);
size_t kv_bytes(const model::Qwen35MoeConfig& config, kv::Format format, int64_t context);
// The K/V a plan's options ask for, in words: "4 x 8192 positions in fp16", or with a shared pool
// "16384 positions shared by 4 sequence(s) of up to 8192, in fp16".
std::string kv_note(const PlanOptions& options);
// The K/V cache a plan's options ask for: the pool's pages in every attention layer, and a page
// table for each sequence's whole context.
size_t kv_pool_bytes(const model::Qwen35MoeConfig& config, const PlanOptions& options);
size_t kv_layer_bytes(const model::Qwen35MoeConfig& config, kv::Format format, int64_t context);
size_t kv_page_table_bytes(int64_t context);
// The DeltaNet states (per layer: the conv's and the recurrent one) of `sequences` sequences, and
// with window_rows > 1 the states a verify window keeps before each of its tokens but the first (a
// rollback without recomputing; one set, whichever sequence the window is of).
size_t state_bytes(const model::Qwen35MoeConfig& config, int64_t window_rows = 1, int64_t sequences = 1);
// The MTP block as the GPU holds it with PlanOptions::mtp (counted in the trunk): its norms, eh_proj,
// its layer's matrices and all its experts (behind a table of its own), the token embedding table
// (unless the lm head is it), and its K/V cache's bytes (counted with the K/V) in kv::mtp_format.
size_t mtp_trunk_bytes(const model::ModelWeights& weights);
size_t mtp_kv_bytes(const model::Qwen35MoeConfig& config, kv::Format fallback, int64_t context);
size_t state_layer_bytes(const model::Qwen35MoeConfig& config, int64_t window_rows = 1, int64_t sequences = 1);
std::vector<ExpertBytes> expert_bytes(const model::ModelWeights& weights);

// Host RAM: fails (lode::Error) when `bytes` of experts cannot be held in what the machine has
// (MemTotal of /proc/meminfo, less 2 GiB for everything else), saying how much is missing.
void check_host_ram(size_t bytes);
// The machine's RAM (MemTotal of /proc/meminfo; 0 where there is none to read).
size_t host_ram_bytes();

// The plans of several GPUs' shares of the layers as one (cuda/pipeline.h): budgets, bytes and
// expert counts summed, per-layer expert sizes in order, the first share's options and prompt chunk.
MemoryPlan together(std::span<const MemoryPlan> plans);

// Lines for logs and `lode plan`: "trunk 1714.2 MiB, K/V 1280.0 MiB, ..., experts 3302 of 10240 (32.2%)".
std::string summary(const MemoryPlan& plan);
std::string describe(const MemoryPlan& plan);  // the full table, several lines

}  // namespace lode::plan
