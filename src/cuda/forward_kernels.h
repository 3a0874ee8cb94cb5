// The non-matmul kernels of the qwen35moe forward pass on the GPU, decode form (one token per
// call, issue 7's first slice), each mirroring its CPU counterpart in src/cpu. All pointers are
// device memory; `stream` is a cudaStream_t (null: the default stream). Each returns null when
// the launch was queued, else the CUDA runtime's message. No CUDA types here, so host C++ code
// compiled by g++ can call them.
#pragma once
#include <cstdint>

#include "cuda/device_model.h"
#include "cuda/kv_format.h"
#include "cuda/matvec_launch.h"

namespace lode::cuda::kernels {

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w for `rows` rows of n (out may be x); with w_odd,
// odd rows take it instead of w (rows that pair two vectors normed apart: the MTP block's
// embedding | state).
const char* rms_norm(const float* x, const float* w, float* out, int rows, int n, float eps, void* stream,
                     const float* w_odd = nullptr);
// The MTP block's input rows for n consecutive K/V rows of one sequence's cache of the block (a
// verify window's rows, cuda::CudaSession::WindowDrafts): rows [n][2 hidden], row t the embedding
// embedded[t] then the state states[t] ([n][hidden] each); sequences [n], kv_rows [n] (first_row +
// t) and shifts [n] (shift) as the block's attention reads them.
struct MtpRowPlaces {
  int32_t sequence = 0;
  int64_t first_row = 0, shift = 0;
};
const char* mtp_window_rows(const float* embedded, const float* states, int n, int hidden, MtpRowPlaces places,
                            float* rows, int32_t* sequences, int64_t* kv_rows, int64_t* shifts, void* stream);
// A greedy verify window's tokens (at most kMaxWindowTokens), by value: what window_kept compares.
constexpr int kMaxWindowTokens = 16;
struct WindowTokens {
  int32_t n = 0;
  int32_t tokens[kMaxWindowTokens] = {};
};
// *kept = the tokens the window keeps under greedy acceptance: 1 + how many of its drafts
// (tokens[1..n)) in a row equal the greedy token of the row before (greedy[t - 1], on the device).
const char* window_kept(const int32_t* greedy, const WindowTokens& window, int32_t* kept, void* stream);
// The MTP block's input row of the draft step that continues from row kept - 1 of a verify step
// that armed drafts (*kept: window_kept's): that row's output of the block (states[kept - 1]) as
// the row's state (the second half of `row`), its draft (drafts[kept - 1]) into *id for the
// embedding lookup that fills the first half, at K/V row first_row + kept of the sequence's cache
// of the block (sequences[0], kv_rows[0], shifts[0]).
const char* mtp_continued_row(const int32_t* kept, const float* states, const int32_t* drafts, int hidden,
                              MtpRowPlaces places, float* row, int32_t* id, int32_t* sequences, int64_t* kv_rows,
                              int64_t* shifts, void* stream);
// h += d, then out = RMSNorm(h) * w: a residual add and the norm that follows it (rows of n).
const char* add_rms_norm(float* h, const float* d, const float* w, float* out, int rows, int n, float eps,
                         void* stream);

// Consecutive tokens of one sequence in one launch (a speculative verify window): token t's inputs
// at each input pointer + t * in_stride (the stacked product's rows: [n][rows]), its outputs at
// o + t * out_stride. Each token's results are the bits a launch of that token alone gives.
struct TokenRows {
  int n = 1;
  int64_t in_stride = 0, out_stride = 0;
  // The DeltaNet kernels' states before each token but a run's first, kept for a rollback into the
  // window (null: not kept): token t's at kept + (t - 1) * kept_stride, laid out as the state. (A
  // cut keeps at least the window's first token, whose state before is the one the step read.)
  float* kept = nullptr;
  int64_t kept_stride = 0;
  // Each row's sequence (device memory, [n]; null: every row is sequence 0's, in order): the
  // DeltaNet kernels take a run of consecutive rows of one sequence in order (a verify window's
  // tokens), its state at state + sequence * state_stride; runs of different sequences apart.
  const int32_t* sequence = nullptr;
  int64_t state_stride = 0;
};

// Attention, n_tokens tokens at positions *pos, *pos + 1, ... (device memory, so that a captured step
// can be replayed at every position; qg, k and v hold one row per token): per head, q (the first
// half of qg's 2 * head_dim) RMS-normed with q_norm and NeoX-rotated in place; per KV head, k
// normed with k_norm and rotated (in place: k is scratch), then k and v stored into the token's
// row of the paged cache `kv`, in its format (kv/codec.h's bytes). When the format stores keys
// rotated (q4), q is rotated by H too, so q·k is unchanged. Token t's rows are t times their own
// widths apart (a prompt chunk's separate products), or stacked_stride apart when it is not 0 (a
// verify window's stacked q|k|v product: [n_tokens][rows]). With rotary_shift (device memory), the
// rotation's position is the row's plus *rotary_shift (the MTP block's cache, whose rows start at
// the first position it followed). Rows of several sequences (kv.row_sequence): row t's K/V row
// written at position pos[t] of its own sequence's pages, and rotated for that position (plus
// rotary_shift[t]).
const char* attention_prepare(float* qg, float* k, const float* v, const float* q_norm, const float* k_norm,
                              KvView kv, const int64_t* pos, int n_heads, int n_kv_heads, int head_dim, int rope_dims,
                              double rope_theta, float eps, int n_tokens, void* stream, int64_t stacked_stride = 0,
                              const int64_t* rotary_shift = nullptr);
// Rows k and v ([n_tokens][heads * head_dim], device memory) written as they are into positions
// first, first + 1, ... of the paged cache: the same writers as attention_prepare's (tests compare
// their bytes with kv/codec.h's; benchmarks fill a context with it).
const char* kv_write(KvView kv, const float* k, const float* v, int64_t first, int n_tokens, int heads, int head_dim,
                     void* stream);
// out[h] = softmax(q_h K^T / sqrt(head_dim)) V over positions [0, *pos] of the paged cache, times
// sigmoid(gate_h). Split-K: the keys are shared among up to n_splits blocks per head (as many as
// the device runs in one wave, at most n_splits; fixed when a step is captured; the share of each
// follows *pos), whose partials (partials: room for [n_heads][n_splits][head_dim + 2]) a second
// kernel merges by their log-sum-exp weights. fp16, int8 and q4 cells (head_dim 128 or 256) are
// read by a tensor-core kernel, the rest by a float32 one. For a format that stores
// values rotated, the merged output is rotated back before the gate; q must already be in the
// keys' domain (attention_prepare puts it there). A window's token t (tokens) is at position *pos +
// t over positions [0, *pos + t], its qg row in_stride floats on, its out row out_stride, and its
// partials after the earlier tokens' (room for tokens.n times one token's), with the splits one token
// has: its bits are those of its own launch. Rows of several sequences (kv.row_sequence): row t at
// position pos[t] over positions [0, pos[t]] of its own sequence's pages.
const char* attention_decode(const float* qg, KvView kv, const int64_t* pos, int n_heads, int n_kv_heads, int head_dim,
                             int n_splits, float* partials, float* out, void* stream, TokenRows tokens = {});

// Gated DeltaNet, one token: the row qkv [channels] (Q | K | V) goes through the causal conv
// (state [channels][kernel - 1], shifted) and SiLU in place; q and k of each key head are then
// L2-normed (q also scaled by 1/sqrt(dk)). One launch; the rows of a TokenRows in order (in_stride
// apart; out_stride unused), the conv state before each but the first kept where tokens.kept says.
const char* deltanet_prepare(float* qkv, float* conv_state, const float* conv_w, int channels, int kernel,
                             int hk, int dk, void* stream, TokenRows tokens = {});
// The prompt pass's L2 norms: q and k of each key head L2-normed (q also scaled by 1/sqrt(dk)) in
// n_tokens rows of `channels`.
const char* l2_norm_heads(float* qkv, int hk, int dk, int channels, int n_tokens, void* stream);
// Why deltanet_step cannot take heads of dk x dv (dk and dv at most 128, dv a multiple of 4), or
// null when it can. Host code only.
const char* deltanet_step_refuses(int dk, int dv);
// Per value head s: beta = sigmoid(b_s), g = a_s * softplus(alpha_s + dt_bias_s), the delta-rule
// update of state [Hv][dk][dv], o_s = S^T q, then the gated RMSNorm o_s * rsqrt(...) * norm *
// silu(z_s). o: [Hv * dv]. One block a value head (the tokens of a TokenRows in order, the state
// kept in registers between them, and the state before each but the first where tokens.kept says); heads
// deltanet_step_refuses are refused with its message, before anything is queued.
const char* deltanet_step(float* state, const float* qkv, const float* z, const float* b, const float* alpha,
                          const float* a, const float* dt_bias, const float* norm_w, int hk, int hv, int dk, int dv,
                          float eps, float* o, void* stream, TokenRows tokens = {});

// Router: softmax over n_experts logits, the top k (ties: lower index), weights renormalised to 1.
// ids [2k]: the chosen experts, then each plus n_experts (their up halves in a gate|up table).
// n_tokens rows: logits [n_tokens][n_experts], ids [n_tokens][2k], weights [n_tokens][k]. Each
// choice is counted in `tally` (cuda/device_model.h; not when its counts are null).
const char* moe_route(const float* logits, int n_experts, int k, int n_tokens, int32_t* ids, float* weights,
                      RouteTally tally, void* stream);
// The router's float32 product (w: rows x cols floats, rows >= n_experts; logits [rows]) and
// moe_route's top k of the first n_experts logits for one token, in one launch. arrivals: one
// zeroed counter (device memory) the kernel leaves zeroed. A window's window.n rows: row t's x
// window.in_stride floats after row t - 1's, its logits window.out_stride after, its choices as
// moe_route_window lays them out; zeroed counters arrivals [window.n] (one for each block of rows),
// left zeroed. Each row's results are the bits of a launch of that row alone.
const char* router_topk(const float* w, int rows, int cols, const float* x, float* logits, int n_experts, int k,
                        int32_t* ids, float* weights, RouteTally tally, unsigned* arrivals, void* stream,
                        TokenRows window = {});
// moe_route for a verify window's n rows (logits logits_stride apart): ids [2][n][k], every row's
// k experts, then every row's up halves (each plus n_experts), so that the window's gate|up
// problems are the rows' gates, then the rows' ups, and its down problems the first half; weights
// [n][k]. One row: moe_route's layout.
const char* moe_route_window(const float* logits, int64_t logits_stride, int n_experts, int k, int n, int32_t* ids,
                             float* weights, RouteTally tally, void* stream);
// A step's (row, slot) pairs grouped by expert, so that its products read each expert once
// (cuda/matvec_launch.h's ExpertGroup): ids [pairs] (row t's k choices at t k: moe_route_window's
// first half), experts ascending, each expert's pairs in order, up to `most` (1 to kGroupInputs) a
// group; groups [pairs] (the most there can be), those after the last empty. One block; pairs at
// most kMaxGroupPairs. With `absent_groups` (and the experts' `resident` flags): adds the number of
// groups whose expert is not in VRAM (each such group reads its expert over PCIe once, whatever
// its pairs; the CPU miss path takes some back, kernels::miss_dispatch_rows).
constexpr int kMaxGroupPairs = 1024;
constexpr int kMaxRoutedExperts = 512;  // experts a layer that the router and the expert groups take
const char* expert_groups(const int32_t* ids, int pairs, int n_experts, int most, ExpertGroup* groups, void* stream,
                          const uint8_t* resident = nullptr, unsigned* absent_groups = nullptr);
// Greedy sampling on the device: *token = the index of the largest of n logits (the lowest index
// among equals), or -1 when a logit is NaN or +inf or all are -inf (where the host's sampler
// fails), in one launch of `blocks` blocks, each reducing its share to a (value, index) pair in
// partials [blocks] (8 bytes each), the last to finish reducing those. arrivals: one zeroed counter (device memory) the kernel leaves zeroed.
// `rows` rows of logits [rows][n] at once: partials [rows][blocks], arrivals and token [rows].
const char* greedy_token(const float* logits, int n, void* partials, int blocks, unsigned* arrivals, int32_t* token,
                         void* stream, int rows = 1);
// Top candidates on the device (sample::top_candidates, whose bits they are): for each of `rows`
// rows of n logits, the k best by logit (the lower index first among equals) into out [rows][k] in
// no particular order (every finite logit where a row has no more than k; the rest of its entries
// then unwritten), and into finite [rows] how many of its logits are finite (-1 where one is NaN or
// +inf). Each row in `slices` slices, a block each, whose k best the scratch holds: pairs
// [rows][slices][k], counts [rows][slices][2] (int32), arrivals [rows] (zeroed; left zeroed).
struct TopPair {
  int32_t id;
  float logit;
};
struct TopScratch {
  TopPair* pairs;
  int32_t* counts;
  unsigned* arrivals;
  int slices;
};
const char* top_candidates(const float* logits, int n, int k, TopScratch scratch, TopPair* out, int32_t* finite,
                           void* stream, int rows = 1);
// Before top_candidates, for each of `rows` rows of n logits: the logits of its ids set aside
// (sample::TopCandidates::aside) copied out and made -inf in place, so that they take no part in its
// candidates or its count of finite logits. ids [rows][cap] (distinct in a row), counts [rows],
// out [rows][cap].
const char* set_aside(float* logits, int n, const int32_t* ids, const int32_t* counts, int cap, float* out,
                      void* stream, int rows = 1);
// h = silu(g) * u, n values.
const char* swiglu(const float* g, const float* u, float* h, int64_t n, void* stream);
// h += sum_j weights[j] * y[j] (slot order) + sigmoid(*shared_logit) * shared (when shared is not
// null), in place (one block a row); then, when norm_w is not null, normed = RMSNorm(h) * norm_w: the
// expert sum, the residual add and the next norm in one launch, with add_rms_norm's arithmetic.
// y: [k][hidden]. A window's `rows` rows, a block each: y [rows][k][hidden], weights [rows][k], h,
// normed and shared [rows][hidden], row t's shared logit logit_stride floats after row t - 1's.
const char* moe_combine_add_norm(const float* y, const float* weights, int k, const float* shared,
                                 const float* shared_logit, int hidden, float* h, const float* norm_w, float* normed,
                                 float eps, void* stream, int rows = 1, int64_t logit_stride = 0);

}  // namespace lode::cuda::kernels
