// qwen35moe on the GPU under any VRAM budget. The budget is spent as plan/memory_plan.h plans it:
// the trunk (every matrix but the routed experts, uploaded as stored, no dequantized copies), the
// K/V cache in the session's format (kv/format.h), the DeltaNet states (float32), the scratch, and
// as many whole experts as fit; the rest of the experts are read in place from pinned host RAM over
// PCIe (cuda/expert_tier.h). The session holds one or several sequences (K/V pages from one pool,
// DeltaNet states and a position each). A decode step runs one token (or a verify window of a few consecutive
// tokens, or one token each of several sequences, each row with the bits of its own one-token step)
// through the model on the kernels of cuda/matvec.h and cuda/forward_kernels.h, captured once as a
// CUDA graph; a prompt runs in chunks through cuda/prompt_pass.h (tensor-core products). Products
// reach their experts through the tier's (layer, expert) tables, so where an expert lives never
// changes the arithmetic: the tokens are the same at every budget. Embeddings are looked up on the
// host.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/kv_format.h"
#include "cuda/pinned_floats.h"
#include "cuda/step_profile.h"
#include "gguf/reader.h"
#include "model/activations.h"
#include "model/qwen35moe.h"
#include "model/weights.h"
#include "plan/memory_plan.h"
#include "plan/miss_split.h"
#include "plan/swap_policy.h"
#include "sample/sampler.h"

namespace lode::cuda {

class KvPrefix;
class VramAccountant;

// The most tokens one decode step takes (CudaSessionOptions::step_rows).
constexpr int64_t kMaxStepRows = 64;

struct CudaSessionOptions {
  int64_t max_context = 4096;  // positions of K/V kept on the device
  // Tokens one decode step takes at most (decode_window's verify windows; the scratch holds a row
  // for each).
  int64_t step_rows = 1;
  // Tokens a verify window (decode_window) takes at most, the DeltaNet states before each but the
  // first kept for cut_window; also the most rows of a decode_rows step that holds windows of several sequences
  // (1: no windows of several tokens, nothing kept); 0: step_rows.
  int64_t window_rows = 0;
  // Sequences the session holds (each its K/V pages, from the pool, and DeltaNet states; at most step_rows):
  // the one-sequence calls below work on the one use_sequence() chose, and decode_rows runs a step
  // of several at once.
  int64_t sequences = 1;
  // Positions of K/V the sequences share, taken page by page as they write (cuda/kv_cache.h);
  // 0: sequences x max_context, every sequence its whole context. A sequence that has not
  // reserved room (reserve_kv) may find the pool full.
  int64_t kv_positions = 0;
  // The MTP block on the GPU too, for drafting (mtp_append, mtp_draft_rows): its weights, all its
  // experts and its K/V cache in VRAM. Fails for a file without the block.
  bool mtp = false;
  int device = 0;              // the GPU (a CUDA device index), made current by the constructor
  size_t vram_budget = 0;      // bytes; 0: the device's free memory less a margin
  // At most this many experts in VRAM (-1: as many as the budget holds after everything else).
  int64_t max_resident_experts = -1;
  // Which experts go to VRAM first: a score per (layer, expert), [layer][expert] (a routing
  // profile's counts); empty: all alike (a fixed pseudo-random spread over the layers).
  std::vector<double> expert_scores;
  // Adaptive placement between decode steps (plan/swap_policy.h); enabled = false freezes it.
  plan::SwapOptions swaps;
  // Who computes a decode step's absent experts (plan/miss_split.h, cuda/miss_path.h): gpu reads
  // them over PCIe; cpu computes them on the host; automatic splits them between both by measured
  // costs. Either way the products are bit-identical. Needs q8 activations and expert types the
  // host twin covers; automatic falls back to gpu otherwise, cpu refuses.
  plan::MissPath miss_path = plan::MissPath::automatic;
  // Time each phase of a step (waiting for the GPU at every phase boundary, which slows the step
  // but attributes GPU time to the kernels that spent it); see profile().
  bool profile = false;
  // Prompts of more than one token run through the model this many tokens at a time (0 or 1: token
  // by token, through the decode step). The scratch this needs is allocated with the session; when
  // the budget cannot hold it, the plan halves the chunk until it can (down to plan::kMinPromptChunk).
  // The chunk is part of the prompt's arithmetic (how its products are grouped), the budget is not.
  int64_t prompt_chunk = 4096;
  // The precision of the prompt path's matrix products: tf32 (tensor cores) or fp32 (exact to
  // float rounding against the decode step; slower).
  PromptMath prompt_math = PromptMath::tf32;
  // Decode's matrix products: q8 rounds each activation row to 8 bits first (per weight type, as
  // llama.cpp does) and multiplies in integers for Q8_0, Q5_0, Q4_K, Q5_K and Q6_K weights, where the CPU
  // engine's Activations::q8 gives the same products; other types multiply float32 activations
  // (the CPU's q8 rounds those too). f32 multiplies float32 activations everywhere (the CPU
  // engine's default products). Prompts follow prompt_math.
  model::Activations activations = model::Activations::q8;
  // How K/V cells are stored (kv/format.h; the commands default to fp16). fp32 is the plain float
  // math; the other formats are written by kv/codec.h's rules, bit for bit.
  KvFormat kv_format = KvFormat::f32;
  // The physical page of each logical K/V page (empty: in order); tests scramble it.
  std::vector<int32_t> kv_page_order;
  // One share of the layers on several GPUs (cuda/pipeline.h), the session given
  // model::layer_share's weights. With hand_in, the rows of a step or a prompt chunk arrive as the
  // share before left them (h and its normed rows, receive()), not from the embeddings. With
  // next_norm (the next share's first attn_norm, [hidden], +1 folded), the share ends with that
  // norm and leaves h and the normed rows for the share after: it holds no lm head, and its steps
  // give no logits, tokens or hidden states (their results are empty, decode_greedy's -1).
  bool hand_in = false;
  std::vector<float> next_norm;
};

// The memory plan's options for a session's (plan/memory_plan.h), with `budget` bytes of VRAM.
plan::PlanOptions plan_options(const CudaSessionOptions& options, size_t budget);

// What the expert tier has done so far (decode steps and prompts together, unless named).
struct ExpertStats {
  int64_t resident = 0, total = 0;   // experts in VRAM, experts in all
  uint64_t routed = 0;               // (token, expert) routings
  uint64_t missed = 0;               // of them, to experts not in VRAM
  uint64_t decode_miss_bytes = 0;    // expert bytes decode steps read over PCIe
  uint64_t cpu_experts = 0;          // decode misses the CPU computed instead
  uint64_t cpu_hinted_experts = 0;   // of them, those it had read ahead on a hint (cuda/miss_path.h)
  uint64_t cpu_expert_bytes = 0;     // their bytes, read from host RAM by the CPU
  uint64_t cpu_read_ahead_bytes = 0;  // expert bytes the CPU read ahead on hints
  double cpu_seconds = 0;            // the CPU's time computing them
  double gpu_share_seconds = 0;      // the GPU's time from each CPU request to its gather (its own share)
  double host_wait_seconds = 0;      // the gathers' wait for the CPU's answers after that
  uint64_t prompt_miss_bytes = 0;    // expert bytes prompt chunks read over PCIe
  int64_t swaps = 0;                 // experts swapped into VRAM by the adaptive placement
  std::string host_tier;             // how host RAM holds the experts (cuda/expert_tier.h)
  std::string miss_path;             // who computes decode misses, and the measured split
  double hit_rate() const { return routed ? 1.0 - double(missed) / double(routed) : 1.0; }
};

class CudaSession {
 public:
  // Binds and uploads the model's weights; fails (lode::Error) when a tensor's type has no kernel,
  // or with the MiB short when the budget is too small.
  CudaSession(const gguf::Reader& reader, const model::Qwen35MoeConfig& config, CudaSessionOptions options = {});
  // On weights already bound (shared with other sessions or engines); `reader` is their file.
  CudaSession(const gguf::Reader& reader, std::shared_ptr<const model::ModelWeights> weights,
              CudaSessionOptions options = {});
  ~CudaSession();
  CudaSession(const CudaSession&) = delete;
  CudaSession& operator=(const CudaSession&) = delete;

  // Appends tokens; the logits of every new position [n, vocab] when all_logits, else of the last;
  // with `hidden`, every new position's final-normed hidden state into it ([n][hidden]).
  std::vector<float> prefill(std::span<const int32_t> tokens, bool all_logits = false,
                             std::vector<float>* hidden = nullptr);
  // A prompt about to run chunk by chunk (prefill_chunk): its tokens checked against the vocabulary
  // and the context left, and its K/V pages mapped, as prefill does before its first chunk.
  void prepare_prompt(std::span<const int32_t> tokens);
  // One chunk of a prompt, 1 to prompt_chunk() tokens, through the prompt pass, as prefill runs a
  // prompt of several tokens chunk by chunk (several GPUs run each chunk share by share); the
  // logits of every row when all_logits, else of the last when last_logits, else none.
  std::vector<float> prefill_chunk(std::span<const int32_t> tokens, bool all_logits, bool last_logits,
                                   std::vector<float>* hidden = nullptr);
  // Prompt pieces of several sequences (distinct; each its sequence's next tokens) in one pass of
  // the prompt path, which reads each layer's weights once for all of them: each piece's rows get
  // the bits a chunk of its own gives (cuda/prompt_pass.h), every sequence moves on by its piece.
  // Out, per piece: its last row's logits [vocab] and its rows' final-normed hidden states
  // [tokens][hidden], each where asked (none on a share that hands its rows on).
  struct Piece {
    int64_t sequence = 0;
    std::span<const int32_t> tokens;
    bool logits = true;
    bool hidden = false;
  };
  struct PieceOutput {
    std::vector<float> logits, hidden;
  };
  std::vector<PieceOutput> prefill_pieces(std::span<const Piece> pieces);
  // Pieces about to run (prefill_pieces), as prepare_prompt does for a prompt: every one checked,
  // then their K/V pages mapped (nothing changes where one is refused).
  void prepare_pieces(std::span<const Piece> pieces);
  // Whether pieces of these lengths fit one pass: at most step_rows() of them, laid out as
  // prompt_row_starts lays them within prompt_chunk() rows.
  bool pieces_fit(std::span<const int64_t> lengths) const;
  std::vector<float> decode(int32_t token);
  // Appends token and returns the most likely next one (the lowest id among equal logits), chosen
  // on the device: the step copies 4 bytes to the host instead of the vocabulary's logits. Fails
  // where the host's sampler would (a NaN or +inf logit, or all -inf).
  int32_t decode_greedy(int32_t token);
  // A verify window (speculative decoding): tokens at the next positions, 1 to options.step_rows of
  // them, in one step, each row computed as decode() computes it alone (the same bits). Out: every
  // row's logits [n][vocab], or with greedy_only its greedy token (as decode_greedy chooses it,
  // failing where it would) and no logits; with want_hidden, every row's final-normed hidden state
  // [n][hidden] (what the MTP drafter follows).
  struct Window {
    std::vector<float> logits;
    std::vector<int32_t> greedy;
    std::vector<float> hidden;
    // With top candidates (decode_rows' `top`): each row's kTopCandidates best [rows][64], in no
    // order, of which the first `finite` are written where the row has fewer finite logits, and
    // finite [rows] (-1: the row holds a NaN or +inf): kernels::top_candidates.
    std::vector<sample::Scored> top;
    std::vector<int32_t> finite;
    // With top candidates, each row's ids set aside (Row::aside) with their logits, as they were.
    std::vector<std::vector<sample::Scored>> aside;
    // With WindowDrafts: row t's draft, the MTP block's greedy token after row t's greedy token;
    // and where it continues, the draft after the draft of the last row the window keeps.
    std::vector<int32_t> drafts;
    int32_t continued = -1;
  };
  // Drafts armed in a verify step (speculative decoding: cuda/mtp_drafter.h). After the window's
  // rows, the same step runs the MTP block over them, row t pairing row t's final-normed state with
  // row t's greedy token, at K/V row first_row + t of `sequence`'s cache of the block (rotary
  // shift `shift`). Where the window keeps its first t + 1 tokens, rows first_row .. first_row + t
  // - 1 are then the rows the drafter's following writes, and row t's output is the first draft
  // after the window: nothing more to run or wait for before the next window. Greedy windows only
  // (the tokens paired are the greedy ones), of a session with arms_drafts(). With `continues`
  // (windows of at most 16 tokens, room for K/V row first_row + n), the step also runs the draft
  // step after that first draft: the block over one row, the first draft's token paired with its
  // row's output, at the K/V row after it (the row of the last token the window keeps under greedy
  // acceptance, found on the device): the second draft after the window (Window::continued), and
  // its output kept for mtp_continue_from_armed(n).
  struct WindowDrafts {
    int64_t sequence = 0, first_row = 0, shift = 0;
    bool continues = false;
  };
  Window decode_window(std::span<const int32_t> tokens, bool greedy_only = false, bool want_hidden = false,
                       const WindowDrafts* drafts = nullptr);
  // One step over rows of several sequences (1 to step_rows), each its sequence's next token:
  // each row computed as a one-token step of its sequence computes it (the same bits), every
  // sequence one position on for each of its rows. A sequence's rows must be consecutive: several
  // are a verify window of it (its next tokens, in order), and a step that holds one keeps every
  // row's DeltaNet states, for cut_window (at most window_rows rows then). Out as decode_window's,
  // a row each.
  struct Row {
    int64_t sequence = 0;
    int32_t token = 0;
    // With top candidates: ids (ascending, at most sample::kTopAsideMost) whose logits come back
    // apart (Window::aside) and take no part in the candidates (sample::TopCandidates::aside).
    std::span<const int32_t> aside{};
  };
  // With `top` (and not greedy_only): each row's top candidates (Window::top, finite) instead of its
  // logits, found on the device: 64 pairs a row to copy.
  Window decode_rows(std::span<const Row> rows, bool greedy_only = false, bool want_hidden = false, bool top = false);
  // Several GPUs (cuda/pipeline.h): where the rows of the next step (prompt false) or prompt chunk
  // (prefill_chunk) meet the shares before and after this one, on this session's GPU: each row's h
  // and its normed rows, [rows][hidden] each.
  struct HandOver {
    float* h = nullptr;
    float* normed = nullptr;
  };
  HandOver hand_over(bool prompt) const;
  // A share with options.hand_in: the first `rows` rows of the share before's hand_over (on device
  // from_device; its work done) copied into this one's, ahead of this session's next step or chunk.
  void receive(const HandOver& from, int from_device, int64_t rows, bool prompt);
  // Where `rows` rows handed in go (hand_over(prompt)), checked as receive checks them: for a
  // hand-over that another queues (NCCL).
  HandOver receiving(int64_t rows, bool prompt) const;
  bool hands_on() const;  // options.next_norm given: no lm head here
  // Experts of this session's layers that another GPU holds in its VRAM (several GPUs,
  // cuda/pipeline.h), read there in place over peer access with the same products: they count as
  // resident here and never move. Each must be one this session does not hold.
  struct LentExpert {
    int64_t layer = 0, expert = 0;               // of this session's layers
    std::array<const void*, 3> projections{};    // its gate, up and down on the other GPU
  };
  void lend_experts(std::span<const LentExpert> lent);
  void* stream() const;   // the cudaStream_t its steps and chunks run on (NCCL queues hand-overs there)

  // The sequence that prefill, decode, decode_window, cut_window, reset, the snapshots, position()
  // and the others of one sequence work on from now on (0 to options.sequences - 1; 0 at first).
  void use_sequence(int64_t sequence);
  int64_t sequence() const;
  int64_t sequences() const;
  // Right after a decode_window of n > 1 tokens, or a decode_rows step with a window of the current
  // sequence: the sequence as it stood after its first `tokens` (1..n; again, shorter, after a
  // cut), from the DeltaNet states the step kept before each token but the first, nothing run again
  // (speculative decoding's rollback: the window's first token is the one the model chose, always
  // kept). Fails when the sequence's last step kept no states, a later step's did, or for no
  // tokens or more tokens than it kept.
  void cut_window(int64_t tokens);

  // The MTP block (options.mtp; cuda/mtp_drafter.h drafts with it). Each sequence has its own K/V
  // cache of the block, a row per token its drafter has followed, dense from row 0; a row's rotary
  // position is its row plus `shift`. `sequence` names it (0 to sequences - 1), whichever sequence
  // use_sequence() chose.
  bool has_mtp() const;
  // Adds the block's K/V rows for tokens at rows row.. (token t paired with the main model's hidden
  // state before it, hidden [n][hidden], host memory); nothing drafted from them.
  void mtp_append(int64_t sequence, std::span<const int32_t> tokens, std::span<const float> hidden, int64_t row,
                  int64_t shift);
  // One draft for each of one or several sequences in one step of the block (each weight read once
  // for all): row t is sequences[t]'s (distinct sequences, at most step_rows), the block's row for
  // tokens[t] at K/V row rows[t] of its cache with rotary shift shifts[t], paired with hidden row t
  // ([n][hidden]; empty: row t's output of the mtp_draft_rows just before, which must have had the
  // same sequences in the same order), through the lm head. Row t's greedy token into out[t] (the
  // token it gets in a step of any other rows), and where probabilities is not empty (n of them)
  // that token's probability (the logits come to the host for it).
  void mtp_draft_rows(std::span<const int64_t> sequences, std::span<const int32_t> tokens,
                      std::span<const float> hidden, std::span<const int64_t> rows, std::span<const int64_t> shifts,
                      std::span<int32_t> out, std::span<float> probabilities);
  // Whether decode_window can arm drafts (WindowDrafts): the block held, and the embedding table's
  // type one the GPU can expand (the steps' own lookups are the host's).
  bool arms_drafts() const;
  // Verify steps that armed drafts so far: what mtp_continue_from_armed continues from is the last one's.
  int64_t armed_windows() const;
  // Row `row`'s output of the last verify step that armed drafts becomes what an mtp_draft_rows of
  // one row without hidden states pairs its token with (as if a draft step had just left it): the
  // drafts after an armed window's first; row n of a window of n, the output of the draft it
  // continued to (WindowDrafts::continues).
  void mtp_continue_from_armed(int64_t row);
  // What the current sequence's coming steps will be (ready_steps): one-token steps and verify
  // windows of up to `window` tokens (1: none), each giving its greedy tokens, its top candidates
  // (as a decode_rows step of the sequence's one row gives them) or its logits; with `drafts`, the
  // MTP block's steps of up to `window` rows and the cuts of such windows too.
  struct StepsAhead {
    int64_t window = 1;
    enum class Output { greedy, top, logits } output = Output::greedy;
    bool drafts = false;
  };
  // Captures now the graphs those steps replay, and loads their kernels (what the first of each
  // kind otherwise pays, about a millisecond a graph): nothing runs, nothing a sequence holds
  // changes. Windows past window_rows are not readied (they run as several); profiling captures
  // nothing.
  void ready_steps(const StepsAhead& ahead);
  int64_t graphs_captured() const;  // so far: by ready_steps, and by steps and cuts on first use
  void reset();  // empty sequence: K/V forgotten (its pages back to the pool), DeltaNet states zeroed
  // Promises the current sequence room for `positions` positions of K/V in the shared pool
  // (options.kv_positions; replacing its promise, 0 letting it go): false, changing nothing, when
  // the pool cannot promise that beside the other sequences' promises and pages. Always true for a
  // pool of every sequence's whole context.
  bool reserve_kv(int64_t positions);
  // For benchmarks of decode at a depth that a prompt would take long to reach: the sequence
  // becomes `depth` positions long, every attention layer's cells written by the format's own
  // writer from random rows (DeltaNet states as after reset()). A decode step then does the work
  // it does at that depth (it does not depend on what the cells hold); its logits mean nothing.
  void fill_with_random_cells(int64_t depth);

  // The sequence as it stands (K/V cells in the format's own bytes, DeltaNet states, position), to
  // continue later in this session or another one of the same model and K/V format (its pages in
  // any order): what a server needs to keep a conversation's prefix.
  struct Snapshot {
    KvFormat format = KvFormat::f32;
    int64_t positions = 0;
    std::vector<uint8_t> cells;   // kv: positions x every attention layer's K and V rows
    std::vector<float> states;    // every DeltaNet layer's conv state, then its recurrent state
  };
  Snapshot save() const;
  // Fails (lode::Error) for another K/V format, a snapshot longer than max_context, or one of
  // another model's size, changing nothing; a failure part way (the device's, or a pool whose pages
  // are promised to others) leaves the sequence empty.
  void restore(const Snapshot& snapshot);

  // The current sequence's first positions (all it holds now) kept for later in this session:
  // what the engine's checkpoints are on the GPU. Its K/V pages are shared, not copied (a sequence
  // writing into a shared page first copies it to a page of its own; when pages run short, the
  // oldest prefixes move their cells to host memory: cuda/kv_cache.h); its DeltaNet states are
  // copied to host memory (a page-locked block of the session's, which the prefix keeps until it
  // goes). Immutable once kept; it may outlive the session (keeping nothing of the device's then).
  struct Prefix {
    std::shared_ptr<const KvPrefix> cells;
    HostFloats states;  // as Snapshot::states, page-locked where the memory could be had
    const CudaSession* session = nullptr;
    int64_t positions() const;
    int64_t host_bytes() const;  // its states, and its cells once moved to host memory
  };
  std::shared_ptr<const Prefix> keep();
  // The current sequence continues from a prefix kept by any sequence of this session. Fails for
  // another session's, changing nothing; a failure part way leaves the sequence empty.
  void resume(const Prefix& prefix);

  // Bytes one decode step reads at context depth `depth`: the weights it touches (every matrix
  // but the experts, n_experts_used experts per layer, the lm head, one embedding row) and the
  // state (K/V rows of the attention layers read, DeltaNet states read and written).
  struct StepBytes {
    int64_t weights = 0;
    int64_t state = 0;
  };
  StepBytes decode_bytes(int64_t depth) const;

  // Floating-point operations of a prompt of n tokens after `first` positions: two per weight
  // each token multiplies (every matrix but the experts, n_experts_used experts per layer), the
  // lm head once (the last token's logits), and attention's two products over the causal
  // positions (each token with itself and the positions before it).
  double prompt_flops(int64_t first, int64_t n) const;

  // With options.profile: seconds spent so far per phase of the step ("experts", "lm head", ...).
  std::vector<std::pair<std::string, double>> profile() const;
  // With options.profile: how the steps from now on are timed: by phase (the default), or kernel
  // by kernel (an event after each kernel, no waits inside a step: cuda/kernel_clock.h).
  void profile_steps_by(StepProfile how);
  // The kernel-by-kernel times so far, per kernel class, with the bytes each must move.
  std::vector<KernelClassTime> kernel_profile() const;
  // Steps from now on leave out every launch named in `launches` (KernelClassTime::launch names;
  // empty: the whole step again): what a kernel class costs inside the overlapped step is the time
  // a step saves without it (lode bench --profile). The step's outputs, and the states it leaves,
  // are then meaningless: restore a snapshot afterwards.
  void leave_out(std::vector<std::string> launches);
  // Whether a launch may be left out: not the CPU miss path's (its requests and answers pair up
  // with the host's work).
  static bool can_leave_out(std::string_view launch);
  // Likewise for the prompt pass (empty when prompts run token by token).
  std::vector<std::pair<std::string, double>> prompt_profile() const;

  // How the budget is spent (plan/memory_plan.h), and the expert tier's counters (waits for the GPU).
  const plan::MemoryPlan& plan() const;
  ExpertStats expert_stats() const;
  // Routings per (layer, expert) so far, [layer][expert] (waits for the GPU): a routing profile.
  std::vector<uint64_t> routing_counts() const;

  // Tokens per prompt pass (0: prompts run token by token).
  int64_t prompt_chunk() const;
  int64_t step_rows() const;    // the most rows one decode step takes
  int64_t window_rows() const;  // the most tokens a verify window takes (options.window_rows)
  int64_t position() const;
  int64_t max_context() const;
  int device() const;  // options.device
  int64_t kv_pool_positions() const;  // options.kv_positions (0: every sequence its whole context)
  int64_t kv_free_pages() const;      // K/V pages nothing holds now (any thread)
  int64_t vocab() const;
  const model::Qwen35MoeConfig& config() const;
  int64_t kv_bytes() const;  // the K/V cells the sequence holds, in its format's bytes
  KvFormat kv_format() const;
  const VramAccountant& vram() const;
  VramAccountant& vram();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lode::cuda
