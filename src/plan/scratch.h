// The GPU's scratch, laid out on the host: every buffer the decode step and the prompt pass use,
// as byte offsets into one allocation each. The memory plan (plan/memory_plan.h) sums them and the
// CUDA session carves its buffers from them, so what the plan prints is what the session holds.
// No CUDA here: `lode plan` computes it on any machine.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/qwen35moe.h"
#include "model/weights.h"

namespace lode::plan {

// Buffers carved one after another from one allocation, each on a 256-byte boundary. Groups of
// buffers never live at the same time can share bytes: between begin_union() and end_union(),
// each alternative() starts where the union began, and the union ends after the longest.
class Layout {
 public:
  size_t take(size_t bytes);  // the buffer's offset
  size_t floats(int64_t n) { return take(size_t(n > 0 ? n : 1) * 4); }  // at least one
  void begin_union();
  void alternative();
  void end_union();
  size_t total() const { return end_; }
  size_t union_end() const { return union_end_; }  // the end of the longest alternative so far

 private:
  size_t end_ = 0, union_begin_ = 0, union_end_ = 0;
  bool in_union_ = false;
};

// Decode attention shares a KV head's keys among this many blocks (one per 256 positions of the
// context, 1 to 256): fixed when the step is captured.
int attention_splits(int64_t max_context);

// Blocks of the device's greedy choice over the vocabulary (kernels::greedy_token).
constexpr int kGreedyBlocks = 128;
// The device's top candidates cut a row of logits into slices, a block each (kernels::top_candidates):
// as many as hold at least 1,024 logits each, at most 64 (so that the last block to finish picks
// from at most 64 x 64 of theirs): 64 slices of 3,880 for the 248,320 of Qwen3.5/3.6, 8 for lode-mini.
int top_candidate_slices(int64_t vocab);

// The decode step's scratch for up to `rows` rows (a verify window's tokens, or one token each of
// several sequences), offsets in
// bytes; the sizes below are one row's, a buffer of rows holds that many one after another (the
// expert ids: kernels::moe_route_window's [2][rows][k]). The CPU miss path's hint and stage serve
// one-token steps only (a step of several rows gives the CPU its experts by expert group).

struct DecodeScratch {
  // A step's inputs, one after another (one copy from the host writes them): each row's sequence
  // (int32) and position (int64), then its embedding (the residual stream h).
  size_t sequences, positions;             // [rows] each
  size_t h, normed, mixed;                 // [hidden] each
  size_t attention_partials;               // [heads][splits][head_dim + 2]
  size_t qg;                               // q|gate [2 q_dim], then k [kv_dim], then v [kv_dim]
  size_t attn;                             // [q_dim]
  size_t qkv;                              // DeltaNet qkv [channels], z [Hv dv], b [Hv], alpha [Hv]
  size_t o;                                // [Hv dv]
  size_t router_logits;                    // [n_experts + 1]: the router's, then the shared gate's
  size_t weights;                          // [k] route weights
  size_t ids;                              // [2k] int32: chosen experts, then their up halves
  size_t expert_groups;                    // [k] groups of kExpertGroupBytes: a step's pairs by expert
  size_t gu;                               // [2k ff]: gate outputs then up outputs
  size_t y;                                // [k hidden] expert outputs
  size_t shared_gu;                        // [2 shared_ff]
  size_t pair_ids;                         // [2 rows] int32: rows zeros, then rows ones
  size_t shared_out;                       // [hidden]
  size_t logits;                           // [vocab]
  size_t router_arrivals;                  // one unsigned a row, kept zeroed
  size_t route_counts;                     // [layers][n_experts] unsigned: routings per expert
  size_t route_misses;                     // [4][layers] unsigned: routings to experts not in VRAM (decode
                                           // steps read by pair, prompts, grouped steps), then grouped
                                           // steps' reads of them (cuda/session.cpp)
  size_t miss_path;                        // kMissPathScratch bytes: the CPU miss path's device words
  // The CPU miss path's hint: the layer's input normed for the MoE, the router's logits, weights,
  // ids and block counter (kept zeroed) for it.
  size_t hint_normed, hint_logits, hint_weights, hint_ids, hint_arrivals;
  // Its stage's table of the chosen experts [3k] pointers, ids [2k], copies [1 + k] (int32).
  size_t stage_table, stage_ids, stage_copies;
  // Greedy sampling on the device: each block's largest logit [kGreedyBlocks] (float, then int32
  // index), the chosen token (int32), a block counter (kept zeroed).
  size_t greedy_partials, greedy_token, greedy_arrivals;
  // The top candidates' slices (kernels::TopScratch): each slice's best [top_candidate_slices]
  // [sample::kTopCandidates] (8-byte pairs) and its two counts (int32). The row's candidates go
  // where the greedy pick's partials do.
  size_t top_pairs, top_counts;
  // The ids each row's top candidates set aside (kernels::set_aside): counts [rows] (int32), then
  // ids [rows][sample::kTopAsideMost] (int32), one copy from the host; their logits back [rows]
  // [sample::kTopAsideMost].
  size_t top_aside, top_aside_logits;
  // The MTP block's rows (with mtp): [rows][2 hidden], each row's embedding then the hidden state it
  // pairs with; and what each row's rotary position adds to its K/V row [rows] (int64; the rows'
  // sequences and K/V rows in `sequences` and `positions`); and [rows][hidden] for a verify step
  // that drafts (cuda::CudaSession::WindowDrafts): its greedy tokens' embeddings, then the block's
  // outputs, which a draft after it continues from, and one row more for the draft that step
  // continued to (WindowDrafts::continues); then that step's kept tokens and the continued row's
  // token (2 int32).
  size_t mtp_rows, mtp_shifts, mtp_armed, mtp_continue;
  // Steps of several rows: where a product of several inputs rounds each of them to 8 bits once
  // (cuda::MatvecInput::rounded), rounded_x_bytes of it (none for one row); and the same for the
  // shared expert's products, which run on a stream of their own.
  size_t rounded_x, rounded_x_bytes, rounded_x_side, rounded_x_side_bytes;
  size_t total;
  int64_t rows;
};
// One group of a step's (row, slot) pairs routed to one expert (cuda::ExpertGroup: its id, count
// and up to 8 pairs, int32 each).
constexpr size_t kExpertGroupBytes = 40;
// The CPU miss path's device words (cuda/miss_path.h): its request number, a layer's CPU experts
// and their positions, the split table.
constexpr size_t kMissPathScratch = 4096;
DecodeScratch decode_scratch(const model::Qwen35MoeConfig& config, int64_t max_context, int64_t rows = 1,
                             bool mtp = false);
// The most bytes one input of `cols` values takes rounded to 8 bits for an integer product, for any
// weight type (cuda::rounded_inputs_bytes: its values, their scales and sums of 16, or a Q8_0 row's
// layout of them).
size_t rounded_input_bytes(int64_t cols);

// The prompt pass stages a layer's absent experts this many at a time (gate|up, then down), one
// group into each of two staging buffers.
constexpr int64_t kPromptExpertGroup = 32;
// Its expert products work on tiles of at most this many rows routed to one expert
// (cuda/expert_products.h).
constexpr int64_t kPromptExpertTileRows = 128;

// The prompt pass's scratch for `chunk` tokens (offsets in bytes). The attention layers', the
// DeltaNet layers' and the MoE's own buffers are never live at once and share bytes.
struct PromptScratch {
  int64_t chunk = 0, score_floats = 0;
  size_t h, normed, mixed;                  // [chunk][hidden]
  size_t expanded;                          // the largest quantized dense matrix, expanded to float32
  size_t expert_pointers;                   // [3 n_experts] pointers: the matrices a layer's expert products read
  // attention
  size_t qg, kbuf, vbuf, attn, k_rows, v_rows, scores;
  // DeltaNet
  size_t qkv_raw, qkv, z, b, alpha, o;
  // MoE
  size_t router, weights, ids, sorted, slot_of, expert_of, counts, first, hist;
  // A layer's tiles of rows routed to one expert, [expert_tiles_count] of 16 bytes: at most one
  // partial tile per expert besides the full ones.
  size_t expert_tiles, expert_tiles_count;
  size_t xs, gu, act, ys, sg, su, sh, shared_out, shared_logit;
  // Two staging buffers of staging_bytes each: a group's absent experts (gate|up, or down), copied
  // in by the copy engine while the previous group multiplies. staging_apart: no attention or
  // DeltaNet buffer shares their bytes (so a layer's first groups can be copied during its mixer).
  size_t staging, staging_bytes;
  bool staging_apart = false;
  size_t total;
};
PromptScratch prompt_scratch(const model::ModelWeights& weights, int64_t chunk, int64_t max_context);

// Where a layer's staged experts sit in a staging buffer, each part on a 256-byte boundary: the
// i-th expert of a group at i * gate_up (its gate, then its up at up_at) in the gate|up pass, at
// i * down in the down pass.
struct StagingPieces {
  size_t up_at = 0, gate_up = 0, down = 0;
};
StagingPieces staging_pieces(const model::MoeWeights& layer);

}  // namespace lode::plan
