#include "cuda/session.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <chrono>
#include <map>
#include <numeric>
#include <tuple>
#include <optional>
#include <random>
#include <set>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "cpu/host_experts.h"
#include "cuda/dequant.h"
#include "cuda/device_model.h"
#include "cuda/errors.h"
#include "cuda/expert_tier.h"
#include "cuda/forward_kernels.h"
#include "cuda/kernel_clock.h"
#include "cuda/kv_cache.h"
#include "cuda/matvec.h"
#include "cuda/miss_path.h"
#include "cuda/phase_clock.h"
#include "cuda/prompt_pass.h"
#include "cuda/vram.h"
#include "model/weights.h"
#include "plan/memory_plan.h"
#include "sample/logprobs.h"
#include "sample/sampler.h"

namespace lode::cuda {

namespace {

bool same_shape(const DeviceMatrix& a, const DeviceMatrix& b) {
  return a.type == b.type && a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes;
}

}  // namespace

enum class Phase { embedding, norms, attention_proj, attention_core, deltanet_proj, deltanet_core, router, experts,
                   shared_expert, expert_sum, lm_head, output_copy, count };
constexpr const char* kPhaseNames[] = {"embedding (host lookup, copy)", "norms and residuals", "attention projections",
                                       "attention core", "DeltaNet projections", "DeltaNet core",
                                       "router and top-k", "experts", "shared expert",
                                       "expert sum, residual, next norm",
                                       "lm head (and the greedy pick)", "logits or token to the host"};

// The CPU miss path's launches: their requests and answers pair up with the host's work, so a step
// never leaves them out (CudaSession::leave_out).
constexpr std::string_view kMissHintNorm = "the miss hint's norm", kMissHintRouter = "the miss hint's router",
                           kMissHint = "the miss hint", kMissDispatch = "the CPU miss path's dispatch",
                           kMissStage = "staging the GPU's misses", kMissGather = "the CPU miss path's gather";
constexpr std::string_view kMissPathLaunches[] = {kMissHintNorm, kMissHintRouter, kMissHint,
                                                  kMissDispatch, kMissStage,      kMissGather};

struct CudaSession::Impl {
  Impl(const gguf::Reader& r, std::shared_ptr<const model::ModelWeights> w, CudaSessionOptions o)
      : reader(r), bound(std::move(w)), host(*bound), config(host.config), options(o), vram(o.vram_budget, o.device) {}

  const gguf::Reader& reader;
  std::shared_ptr<const model::ModelWeights> bound;
  const model::ModelWeights& host;  // views into the mapping (embeddings are looked up on the host)
  model::Qwen35MoeConfig config;
  CudaSessionOptions options;
  VramAccountant vram;
  std::vector<DeviceBuffer> buffers;
  std::vector<std::pair<const gguf::TensorInfo*, const uint8_t*>> uploaded;  // tensor -> device bytes
  plan::MemoryPlan plan;
  std::unique_ptr<ExpertTier> tier;
  std::vector<DeviceLayer> layers;
  // Every layer's state as the decode step reads it: the K/V view of every sequence's page tables
  // (the step's rows say whose: KvView::row_sequence), sequence 0's DeltaNet states (the others'
  // follow, state_stride apart: kernels::TokenRows::sequence). sequence_states() gives one
  // sequence's own.
  std::vector<LayerState> states;
  std::unique_ptr<KvCache> kv;
  // The output norm and the lm head; on a share that hands its rows on (options.next_norm), the
  // next share's first norm and no head.
  const float* output_norm = nullptr;
  DeviceMatrix output;
  bool hands_on() const { return !options.next_norm.empty(); }
  // Each sequence's place on the host: its position, and the last step's window while cut_window
  // may cut it (its first position, -1: none, its tokens, and the step's row its first token was:
  // where its kept states start).
  struct Place {
    int64_t position = 0;
    int64_t window_start = -1, window_tokens = 0, window_row = 0;
  };
  std::vector<Place> places;
  int64_t current = 0;  // the sequence the one-sequence calls work on (CudaSession::use_sequence)
  Place& place() { return places[size_t(current)]; }
  const Place& place() const { return places[size_t(current)]; }
  PhaseClock clock{std::vector<std::string>(std::begin(kPhaseNames), std::end(kPhaseNames)), options.profile};
  StepProfile step_profile = StepProfile::phases;
  KernelClock kernel_clock;
  bool timing_kernels() const { return options.profile && step_profile == StepProfile::kernels; }
  void mark(Phase phase) {
    if (!timing_kernels()) clock.mark(size_t(phase));
  }
  // A kernel of the step was queued on `stream`: booked to `what` (with its weights' type, if any)
  // when timing kernels.
  void queued(std::string_view what, double bytes = 0, std::optional<GgmlType> weights = std::nullopt) {
    if (!timing_kernels()) return;
    if (!weights) return kernel_clock.after(what, what, bytes, stream);
    kernel_clock.after(fmt::format("{} ({})", what, traits(*weights).name), what, bytes, stream);
  }
  // Queues one kernel of the step (kernel() launches it and returns null or the runtime's error),
  // unless its class is left out (leave_out).
  template <class Kernel>
  void launch(std::string_view what, Kernel&& kernel, double bytes = 0) {
    if (is_left_out(what)) return;
    check(kernel(), what);
    queued(what, bytes);
  }
  std::set<std::string, std::less<>> left_out;  // kernel classes the step leaves out (CudaSession::leave_out)
  bool is_left_out(std::string_view what) const { return !left_out.empty() && left_out.count(what) > 0; }

  // Scratch for up to options.step_rows tokens (plan::DecodeScratch): each buffer holds a row per
  // token of a window, one after another.
  float* attention_partials;
  float *h, *normed, *mixed, *qg, *kbuf, *vbuf, *attn, *qkv, *z, *b, *alpha, *o, *router_logits, *weights;
  float *g, *y, *sg, *shared_out, *logits;
  int32_t* ids;
  ExpertGroup* expert_groups;  // a step's (row, slot) pairs by expert (kernels::expert_groups)
  int32_t* pair_ids;  // rows zeros, then rows ones: the shared expert's gate and up in one grouped launch
  void* rounded_x;       // where a product of several rows rounds them (MatvecInput::rounded; null for one row)
  void* rounded_x_side;  // and the side stream's (the shared expert's products, beside the routed ones)
  unsigned* router_arrivals;    // for router_topk's last block, one a row (kept zeroed)
  void* greedy_partials;        // greedy_token's per-block pairs
  int32_t* device_token;        // and its token
  unsigned* greedy_arrivals;    // and its block counter (kept zeroed)
  kernels::TopScratch top_scratch;  // the top candidates' slices (the greedy pick's counter theirs too)
  int32_t* top_aside;               // each row's count of ids set aside, then the ids [rows][kTopAsideMost]
  float* top_aside_logits;          // and their logits [rows][kTopAsideMost]
  unsigned* route_counts;       // [layer][expert]: routings so far (decode steps and prompts)
  // [4][layer]: routings to absent experts by decode steps whose products read an expert for each
  // (one-token steps, windows by pair), by prompts, and by steps grouped by expert; then the groups
  // of those grouped steps that read an absent expert over PCIe (kernels::expert_groups, less the
  // CPU's: kernels::miss_dispatch_rows).
  unsigned* route_misses;
  float *hint_normed, *hint_logits, *hint_weights;  // the CPU miss path's hint (plan::DecodeScratch)
  int32_t* hint_ids;
  unsigned* hint_arrivals;
  const void** stage_table;        // the CPU miss path's stage (kernels::MissStage): [3k] pointers,
  int32_t *stage_ids, *stage_copies;  // [2k] ids, [1 + k] copies

  void* allocate(size_t bytes, VramUse use, const std::string& what) {
    buffers.emplace_back(vram, bytes, use, what);
    return buffers.back().data();
  }
  float* floats(int64_t n, VramUse use, const std::string& what) {
    return static_cast<float*>(allocate(size_t(std::max<int64_t>(n, 1)) * sizeof(float), use, what));
  }
  const float* upload(const std::vector<float>& v, const std::string& what) {
    float* d = floats(int64_t(v.size()), VramUse::weights, what);
    copy_to_device(d, v.data(), v.size() * sizeof(float));
    return d;
  }

  // The device copy of the tensor holding `host_bytes` (uploaded on first use).
  const uint8_t* device_of(const uint8_t* host_bytes, VramUse use) {
    for (const auto& [tensor, device] : uploaded)
      if (host_bytes >= tensor->data && host_bytes < tensor->data + tensor->size) return device + (host_bytes - tensor->data);
    for (const gguf::TensorInfo& t : reader.tensors()) {
      if (host_bytes < t.data || host_bytes >= t.data + t.size) continue;
      auto* device = static_cast<uint8_t*>(allocate(t.size, use, t.name));
      copy_mapped_to_device(device, t.data, t.size);
      uploaded.emplace_back(&t, device);
      return device + (host_bytes - t.data);
    }
    fail("cuda session: a weight view points outside every tensor");
  }

  static void matrix_type_check(const model::MatrixView& m) {
    if (!has_matvec(m.type->type))
      fail("the CUDA backend has no kernel for {} weights yet; requantize the model (lode quantize --recipe "
           "ud-q4_k_xl) or run it on the CPU", m.type->name);
  }

  DeviceMatrix matrix(const model::MatrixView& m, VramUse use = VramUse::weights) {
    if (m.empty()) return {};
    matrix_type_check(m);
    return {m.type->type, device_of(m.data, use), m.rows, m.cols, m.row_bytes};
  }

  // A device-side table of matrix pointers.
  const void* const* table_of(const std::vector<const void*>& pointers, const std::string& what) {
    auto* device = static_cast<const void**>(allocate(pointers.size() * sizeof(void*), VramUse::weights, what + " table"));
    copy_to_device(device, pointers.data(), pointers.size() * sizeof(void*));
    return device;
  }

  // The experts of one projection behind the tier's table for their layer.
  static DeviceExperts experts_of(const model::MatrixView& first, const void* const* table) {
    matrix_type_check(first);
    return {first.type->type, table, first.rows, first.cols, first.row_bytes};
  }

  // Layer `index`'s experts through the tier's table (gate e at e, up at n + e, down at 2n + e: gate
  // and up together are one table of 2n, so one grouped launch does both when they share a shape),
  // and where its routing is counted.
  void bind_experts(DeviceLayer& d, int64_t index) {
    const model::MoeWeights& m = host.layers[size_t(index)].moe;
    const void* const* t = tier->table(index);
    const int64_t n = config.n_experts;
    d.gate = experts_of(m.gate.first, t), d.up = experts_of(m.up.first, t + n), d.down = experts_of(m.down.first, t + 2 * n);
    if (model::same_shape(m.gate.first, m.up.first)) d.gate_up = d.gate;
    d.tally = {route_counts + index * n, tier->resident_flags(index), route_misses + index};
  }

  void bind_layer(int64_t index) {
    DeviceLayer d = bind_trunk(host.layers[size_t(index)], "blk." + std::to_string(index) + " ");
    bind_experts(d, index);
    layers.push_back(d);
  }

  // A layer's matrices and vectors but its routed experts, uploaded.
  DeviceLayer bind_trunk(const model::LayerWeights& w, const std::string& at) {
    const model::Qwen35MoeConfig& c = config;
    DeviceLayer d;
    d.recurrent = w.recurrent;
    d.attn_norm = upload(w.attn_norm, at + "attn_norm");
    d.post_norm = upload(w.post_attention_norm, at + "post_attention_norm");
    if (w.recurrent) {
      const model::DeltaNetWeights& n = w.deltanet;
      stack_mixer_inputs(d, {{&n.qkv, &d.qkv}, {&n.gate, &d.z}, {&n.beta, &d.b}, {&n.alpha, &d.alpha}}, at);
      d.out = matrix(n.out);
      d.conv = upload(n.conv, at + "conv"), d.dt_bias = upload(n.dt_bias, at + "dt_bias");
      d.a = upload(n.a, at + "ssm_a"), d.norm = upload(n.norm, at + "ssm_norm");
    } else {
      const model::AttentionWeights& a = w.attention;
      stack_mixer_inputs(d, {{&a.q, &d.q}, {&a.k, &d.k}, {&a.v, &d.v}}, at);
      d.o = matrix(a.output);
      d.q_norm = upload(a.q_norm, at + "q_norm"), d.k_norm = upload(a.k_norm, at + "k_norm");
    }
    const model::MoeWeights& m = w.moe;
    bind_router(d, m, at);
    if (c.shared_ff > 0) {
      d.shared_gate = matrix(m.shared_gate), d.shared_up = matrix(m.shared_up), d.shared_down = matrix(m.shared_down);
      if (same_shape(d.shared_gate, d.shared_up))
        d.shared_gate_up = {d.shared_gate.type, table_of({d.shared_gate.data, d.shared_up.data}, at + "shared gate|up"),
                            d.shared_gate.rows, d.shared_gate.cols, d.shared_gate.row_bytes};
    }
    return d;
  }

  // The mixer's input matrices, in order, uploaded as stored; runs of the same type and width go
  // into one buffer (d.mixer_in), so one launch multiplies them all (see DeviceLayer).
  void stack_mixer_inputs(DeviceLayer& d, const std::vector<std::pair<const model::MatrixView*, DeviceMatrix*>>& parts,
                          const std::string& at) {
    for (size_t i = 0; i < parts.size();) {
      const model::MatrixView& first = *parts[i].first;
      size_t end = i + 1;
      int64_t rows = first.rows;
      while (end < parts.size() && parts[end].first->type == first.type && parts[end].first->cols == first.cols &&
             parts[end].first->row_bytes == first.row_bytes)
        rows += parts[end++].first->rows;
      if (end == i + 1) {
        *parts[i].second = matrix(first);
      } else {
        matrix_type_check(first);
        auto* stacked = static_cast<uint8_t*>(allocate(size_t(rows) * first.row_bytes, VramUse::weights, at + "mixer inputs"));
        size_t offset = 0;
        for (size_t p = i; p < end; ++p) {
          const model::MatrixView& m = *parts[p].first;
          copy_mapped_to_device(stacked + offset, m.data, size_t(m.rows) * m.row_bytes);
          *parts[p].second = {m.type->type, stacked + offset, m.rows, m.cols, m.row_bytes};
          offset += size_t(m.rows) * m.row_bytes;
        }
      }
      d.mixer_in[d.n_mixer_in++] = {first.type->type, parts[i].second->data, rows, first.cols, first.row_bytes};
      i = end;
    }
  }

  // The router, and the shared expert's gate row after it in the same float32 matrix when both are
  // float32: one product gives both (router and shared_logit are views of its rows).
  void bind_router(DeviceLayer& d, const model::MoeWeights& m, const std::string& at) {
    const model::Qwen35MoeConfig& c = config;
    const bool shared = c.shared_ff > 0;
    if (!shared || m.router.type->type != GgmlType::F32) {
      d.router = matrix(m.router);
      if (shared) d.shared_logit = {GgmlType::F32, upload(m.shared_gate_inp, at + "shared gate"), 1, c.hidden, size_t(c.hidden) * 4};
      return;
    }
    std::vector<float> rows(size_t((m.router.rows + 1) * c.hidden));
    for (int64_t r = 0; r < m.router.rows; ++r)
      std::copy_n(reinterpret_cast<const float*>(m.router.row(r)), c.hidden, rows.data() + r * c.hidden);
    std::copy(m.shared_gate_inp.begin(), m.shared_gate_inp.end(), rows.data() + m.router.rows * c.hidden);
    const float* both = upload(rows, at + "router and shared gate");
    const size_t row_bytes = size_t(c.hidden) * 4;
    d.router_and_shared_logit = {GgmlType::F32, both, m.router.rows + 1, c.hidden, row_bytes};
    d.router = {GgmlType::F32, both, m.router.rows, c.hidden, row_bytes};
    d.shared_logit = {GgmlType::F32, both + m.router.rows * c.hidden, 1, c.hidden, row_bytes};
  }

  // Decode attention shares the keys among this many blocks per KV head (and group of 8 query
  // heads), fixed for the graph: one per 256 positions of the context, at most 256 (a block's warps
  // walk their share in tiles of 32 keys, so short walks matter more than the empty blocks of a
  // shallow context, which return at once).
  int attention_splits() const { return plan::attention_splits(options.max_context); }
  // One attention layer's K/V bytes a position holds.
  double kv_bytes_per_layer() const { return double(kv->bytes_per_position()) / kv->n_layers(); }

  // The sequences' state: one paged K/V cache for the attention layers (each layer its view of it)
  // and the DeltaNet layers' states, options.sequences of each.
  void allocate_sequences() {
    const int64_t n = options.sequences;
    int n_attention = 0;
    for (const DeviceLayer& d : layers) n_attention += !d.recurrent;
    kv = std::make_unique<KvCache>(vram, options.kv_format, n_attention, config.n_kv_heads, config.head_dim,
                                   options.max_context, options.kv_page_order, n, options.kv_positions);
    places.assign(size_t(n), Place{});
    int index = 0;
    states.resize(layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      const std::string at = "blk." + std::to_string(l) + " ";
      if (!layers[l].recurrent) {
        states[l].kv = kv->layer(index++);
        states[l].kv.row_sequence = device_sequences, states[l].kv.pages_stride = kv->pages_per_sequence();
        continue;
      }
      states[l].conv_state = floats(n * conv_floats(), VramUse::state, at + "conv states");
      states[l].ssm_state = floats(n * recurrent_floats(), VramUse::state, at + "DeltaNet states");
      if (window_rows() > 1) {  // the states a window keeps before each token but its first
        const int64_t kept = window_rows() - 1;  // (plan::state_layer_bytes)
        states[l].conv_kept = floats(kept * conv_floats(), VramUse::state, at + "a window's conv states");
        states[l].ssm_kept = floats(kept * recurrent_floats(), VramUse::state, at + "a window's DeltaNet states");
      }
    }
    for (int64_t s = 0; s < n; ++s) own_states.push_back(own_states_of(s));
  }
  int64_t window_rows() const { return options.window_rows > 0 ? options.window_rows : options.step_rows; }
  int64_t conv_floats() const { return config.conv_channels() * (config.ssm_conv_kernel - 1); }
  int64_t recurrent_floats() const { return config.ssm_dt_rank * config.ssm_state * config.ssm_state; }

  // Sequence s's own state of each layer (its page table, its DeltaNet states): what one-sequence
  // steps, the prompt pass, the snapshots and the cuts read (own_states, made once).
  std::vector<std::vector<LayerState>> own_states;
  const std::vector<LayerState>& sequence_states(int64_t s) const { return own_states[size_t(s)]; }
  std::vector<LayerState> own_states_of(int64_t s) const {
    std::vector<LayerState> own = states;
    int index = 0;
    for (LayerState& st : own) {
      if (st.conv_state) {
        st.conv_state += s * conv_floats(), st.ssm_state += s * recurrent_floats();
        continue;
      }
      st.kv = kv->layer(index++, s);
    }
    return own;
  }

  // The step's scratch, carved from one allocation as plan::decode_scratch lays it out (the
  // routing counters in it are zeroed here and only ever added to).
  void allocate_scratch() {
    const model::Qwen35MoeConfig& c = config;
    const plan::DecodeScratch l = plan::decode_scratch(c, options.max_context, options.step_rows, options.mtp);
    auto* base = static_cast<uint8_t*>(allocate(l.total, VramUse::scratch, "decode scratch"));
    scratch_layout = l, scratch_base = base;
    check_cuda(cudaMemset(base, 0, l.total), "zeroing the decode scratch");
    const auto f = [&](size_t offset) { return reinterpret_cast<float*>(base + offset); };
    h = f(l.h), normed = f(l.normed), mixed = f(l.mixed), attention_partials = f(l.attention_partials);
    // Each mixer's inputs consecutive, as its stacked products write them.
    // (A window's rows of these: [T][the stacked product's rows], mixer_rows() apart.)
    qg = f(l.qg), kbuf = qg + 2 * c.q_dim(), vbuf = kbuf + c.kv_dim(), attn = f(l.attn);
    qkv = f(l.qkv), z = qkv + c.conv_channels(), b = z + c.ssm_value_dim(), alpha = b + c.ssm_dt_rank, o = f(l.o);
    router_logits = f(l.router_logits), weights = f(l.weights);
    ids = reinterpret_cast<int32_t*>(base + l.ids);
    static_assert(sizeof(ExpertGroup) == plan::kExpertGroupBytes);
    // The top candidates go where the greedy pick's partials do (8 bytes a pair there too).
    static_assert(sample::kTopCandidates <= plan::kGreedyBlocks && sizeof(kernels::TopPair) == 8);
    expert_groups = reinterpret_cast<ExpertGroup*>(base + l.expert_groups);
    g = f(l.gu), y = f(l.y), sg = f(l.shared_gu);  // the up halves follow: see moe() and shared_expert()
    pair_ids = reinterpret_cast<int32_t*>(base + l.pair_ids);
    std::vector<int32_t> pairs(size_t(2 * l.rows), 0);
    std::fill(pairs.begin() + l.rows, pairs.end(), 1);
    copy_to_device(pair_ids, pairs.data(), pairs.size() * sizeof(int32_t));
    shared_out = f(l.shared_out), logits = f(l.logits);
    rounded_x = l.rounded_x_bytes ? base + l.rounded_x : nullptr;
    rounded_x_side = l.rounded_x_side_bytes ? base + l.rounded_x_side : nullptr;
    router_arrivals = reinterpret_cast<unsigned*>(base + l.router_arrivals);
    device_positions = reinterpret_cast<int64_t*>(base + l.positions);
    device_sequences = reinterpret_cast<int32_t*>(base + l.sequences);
    route_counts = reinterpret_cast<unsigned*>(base + l.route_counts);
    route_misses = reinterpret_cast<unsigned*>(base + l.route_misses);
    miss_words = base + l.miss_path;
    hint_normed = f(l.hint_normed), hint_logits = f(l.hint_logits), hint_weights = f(l.hint_weights);
    hint_ids = reinterpret_cast<int32_t*>(base + l.hint_ids);
    hint_arrivals = reinterpret_cast<unsigned*>(base + l.hint_arrivals);
    stage_table = reinterpret_cast<const void**>(base + l.stage_table);
    stage_ids = reinterpret_cast<int32_t*>(base + l.stage_ids), stage_copies = reinterpret_cast<int32_t*>(base + l.stage_copies);
    greedy_partials = base + l.greedy_partials, device_token = reinterpret_cast<int32_t*>(base + l.greedy_token);
    greedy_arrivals = reinterpret_cast<unsigned*>(base + l.greedy_arrivals);
    top_scratch = {reinterpret_cast<kernels::TopPair*>(base + l.top_pairs), reinterpret_cast<int32_t*>(base + l.top_counts),
                   greedy_arrivals, plan::top_candidate_slices(c.vocab)};
    top_aside = reinterpret_cast<int32_t*>(base + l.top_aside), top_aside_logits = f(l.top_aside_logits);
  }

  // (cudaMemset runs on the default stream: whatever the step's stream still holds, a cut window's
  // copies say, goes first. The states' copies below go on the step's stream.)
  // The current sequence's.
  void zero_states() {
    if (stream) check_cuda(cudaStreamSynchronize(stream), "the step's stream");
    for (const LayerState& st : sequence_states(current)) {
      if (!st.conv_state) continue;
      cudaMemset(st.conv_state, 0, size_t(conv_floats()) * sizeof(float));
      cudaMemset(st.ssm_state, 0, size_t(recurrent_floats()) * sizeof(float));
    }
    place() = Place{};
  }

  // The current sequence's DeltaNet states on the host: every DeltaNet layer's conv state, then
  // its recurrent state (Snapshot::states), state_floats() in all; and back. The copies go on the
  // step's stream, which they wait for; to the host, it is synchronised before they return.
  size_t state_floats() const {
    size_t n_recurrent = 0;
    for (const DeviceLayer& d : layers) n_recurrent += d.recurrent;
    return n_recurrent * size_t(conv_floats() + recurrent_floats());
  }
  void states_to_host(float* out) const {
    const size_t conv = size_t(conv_floats()), recurrent = size_t(recurrent_floats());
    for (const LayerState& st : sequence_states(current)) {
      if (!st.conv_state) continue;
      check_cuda(cudaMemcpyAsync(out, st.conv_state, conv * sizeof(float), cudaMemcpyDeviceToHost, stream),
                 "copy from the device");
      check_cuda(cudaMemcpyAsync(out + conv, st.ssm_state, recurrent * sizeof(float), cudaMemcpyDeviceToHost, stream),
                 "copy from the device");
      out += conv + recurrent;
    }
    check_cuda(cudaStreamSynchronize(stream), "copy from the device");
  }
  std::vector<float> states_to_host() const {
    std::vector<float> out(state_floats());
    states_to_host(out.data());
    return out;
  }
  void check_states(size_t saved) const {
    if (saved != state_floats())
      fail("cuda session: the snapshot's DeltaNet states ({} floats) are not this model's ({})", saved, state_floats());
  }
  // (The caller synchronises before the host memory may go.)
  void states_from_host(const float* at, size_t count) {
    check_states(count);
    const size_t conv = size_t(conv_floats()), recurrent = size_t(recurrent_floats());
    for (const LayerState& st : sequence_states(current)) {
      if (!st.conv_state) continue;
      check_cuda(cudaMemcpyAsync(st.conv_state, at, conv * sizeof(float), cudaMemcpyHostToDevice, stream),
                 "copy to the device");
      check_cuda(cudaMemcpyAsync(st.ssm_state, at + conv, recurrent * sizeof(float), cudaMemcpyHostToDevice, stream),
                 "copy to the device");
      at += conv + recurrent;
    }
  }
  // Prefixes' states: blocks of state_floats(), kept for reuse (made on first use).
  std::shared_ptr<PinnedBlocks> prefix_states;
  // Moves saved cells and states into the current sequence; if that fails part way, the sequence is
  // left empty (its K/V pages back) rather than its old position over cells it no longer holds.
  template <class Move>
  void move_in(Move&& move) {
    try {
      move();
    } catch (...) {
      try {
        zero_states();
        kv->trim(current, 0);
      } catch (...) {  // (the device's own failure: the first error is the one to report)
      }
      throw;
    }
  }
  // Before cells of positions [first, end) of a sequence are written: its shared pages there
  // exchanged for pages of its own (cuda/kv_cache.h), once the step's stream is done with them.
  void prepare_kv(int64_t sequence, int64_t first, int64_t end) {
    if (kv->writable(sequence, first, end)) return;
    check_cuda(cudaStreamSynchronize(stream), "the step's stream");
    kv->prepare_write(sequence, first, end);
  }

  plan::DecodeScratch scratch_layout{};  // where allocate_scratch carved the buffers from
  uint8_t* scratch_base = nullptr;

  // The tokens the step being queued takes (a verify window's; 1 outside one): every launch below
  // runs them all, each row computed as a one-token step computes it.
  int window = 1;
  bool keeping = false;  // and whether they are a window that keeps its states before each token but the first

  // How decode's products read their input (swiglu_up: see MatvecInput).
  // Products queued on the side stream (`on`) round their inputs into scratch of their own.
  MatvecInput input(int64_t swiglu_up = 0, cudaStream_t on = nullptr) const {
    MatvecInput in{.swiglu_up = swiglu_up, .q8 = options.activations == model::Activations::q8};
    const bool side = on && on == side_stream;
    in.rounded = side ? rounded_x_side : rounded_x;
    in.rounded_bytes = side ? scratch_layout.rounded_x_side_bytes : scratch_layout.rounded_x_bytes;
    return in;
  }
  // A grouped product's problems over the window's rows: runs of `per_row` problems, one run a row,
  // and the runs start again after the last row (gate|up: every row's gates, then its ups).
  MatvecInput rows_of(MatvecInput in, int64_t per_row) const {
    in.x_run = int32_t(per_row), in.x_inputs = window;
    return in;
  }

  // Products on `on` (null: the step's stream); `what` names them in the per-kernel profile, whose
  // bytes count every problem's matrix (also those the CPU miss path computes instead).
  void grouped(std::string_view what, const DeviceExperts& e, const int32_t* which, int64_t n, const float* x,
               int64_t x_stride, float* out, const MatvecInput& in, cudaStream_t on = nullptr) {
    if (is_left_out(what)) return;
    grouped_matvec(e.type, e.table, which, n, e.rows, e.cols, e.row_bytes, x, x_stride, out, on ? on : stream, in);
    queued(what, double(n) * double(in.group_parts) * double(e.rows) * double(e.row_bytes), e.type);
  }

  // A plain product of the window's rows (x [window][cols]; out rows y_stride apart, 0: m.rows).
  void mv(std::string_view what, const DeviceMatrix& m, const float* x, float* out, int64_t swiglu_up = 0,
          cudaStream_t on = nullptr, int64_t y_stride = 0) {
    if (is_left_out(what)) return;
    MatvecInput in = input(swiglu_up, on);
    in.y_stride = y_stride;
    matvec(m.type, m.data, m.rows, m.cols, m.row_bytes, x, out, window, on ? on : stream, in);
    queued(what, double(m.rows) * double(m.row_bytes), m.type);
  }

  // The rows of a layer's mixer inputs, all stacked runs together: a window's rows are this far apart.
  static int64_t mixer_rows(const DeviceLayer& d) {
    int64_t rows = 0;
    for (int i = 0; i < d.n_mixer_in; ++i) rows += d.mixer_in[i].rows;
    return rows;
  }

  // The mixer's input products, one launch per stacked run, outputs one after another from `out`
  // (a window's rows mixer_rows apart).
  void mixer_inputs(std::string_view what, const DeviceLayer& d, float* out) {
    const int64_t stride = mixer_rows(d);
    for (int i = 0; i < d.n_mixer_in; ++i) {
      mv(what, d.mixer_in[i], normed, out, 0, nullptr, stride);
      out += d.mixer_in[i].rows;
    }
  }

  // The attention layer's q, k and v, the new K/V rows written at *at (device memory; rotated at
  // *at + *shift where shift is not null: the MTP block's cache).
  void attention_kv(const DeviceLayer& d, const LayerState& st, const int64_t* at, const int64_t* shift = nullptr) {
    const model::Qwen35MoeConfig& c = config;
    mixer_inputs("attention q|k|v", d, qg);  // qg, kbuf, vbuf are consecutive
    mark(Phase::attention_proj);
    launch("attention prepare", [&] {
      return kernels::attention_prepare(qg, kbuf, vbuf, d.q_norm, d.k_norm, st.kv, at, int(c.n_heads),
                                        int(c.n_kv_heads), int(c.head_dim), int(c.rope_dims), c.rope_theta,
                                        float(c.rms_eps), window, stream, mixer_rows(d), shift);
    });
  }

  void attention(const DeviceLayer& d, const LayerState& st, const int64_t* at, const int64_t* shift = nullptr) {
    const model::Qwen35MoeConfig& c = config;
    attention_kv(d, st, at, shift);
    launch(
        "attention (split-K and merge)",
        [&] {
          return kernels::attention_decode(qg, st.kv, at, int(c.n_heads), int(c.n_kv_heads),
                                           int(c.head_dim), attention_splits(), attention_partials, attn, stream,
                                           {window, mixer_rows(d), c.q_dim()});
        },
        kv_bytes_per_layer() * double(place().position + 1) * window);
    mark(Phase::attention_core);
    mv("attention out", d.o, attn, mixed);
    mark(Phase::attention_proj);
  }

  void deltanet(const DeviceLayer& d, const LayerState& st) {
    const model::Qwen35MoeConfig& c = config;
    mixer_inputs("DeltaNet qkv|z|b|alpha", d, qkv);  // qkv, z, b, alpha are consecutive
    mark(Phase::deltanet_proj);
    // Each row's state is its sequence's; a window keeps the states before each of its tokens but
    // its first, for cut_window.
    kernels::TokenRows rows{window, mixer_rows(d), c.ssm_value_dim()};
    if (stepping == &states) rows.sequence = device_sequences;  // rows of several sequences
    kernels::TokenRows conv_rows = rows, recurrent_rows = rows;
    conv_rows.state_stride = conv_floats(), recurrent_rows.state_stride = recurrent_floats();
    if (keeping) {
      conv_rows.kept = st.conv_kept, conv_rows.kept_stride = conv_floats();
      recurrent_rows.kept = st.ssm_kept, recurrent_rows.kept_stride = recurrent_floats();
    }
    launch("DeltaNet conv", [&] {
      return kernels::deltanet_prepare(qkv, st.conv_state, d.conv, int(c.conv_channels()), int(c.ssm_conv_kernel),
                                       int(c.ssm_groups), int(c.ssm_state), stream, conv_rows);
    });
    // The state bytes it moves: each row's own state read and written (rows of several sequences),
    // or the one sequence's once, and a window's kept copies written (one window's; at most that
    // where several sequences' windows share the step).
    const double state_bytes = double(recurrent_floats()) * sizeof(float);
    launch(
        "DeltaNet step and gated norm",
        [&] {
          return kernels::deltanet_step(st.ssm_state, qkv, z, b, alpha, d.a, d.dt_bias, d.norm, int(c.ssm_groups),
                                        int(c.ssm_dt_rank), int(c.ssm_state), int(c.ssm_state), float(c.rms_eps), o,
                                        stream, recurrent_rows);
        },
        2.0 * state_bytes * (rows.sequence ? window : 1) + (keeping ? state_bytes * (window - 1) : 0.0));
    mark(Phase::deltanet_core);
    mv("DeltaNet out", d.out, o, mixed);
    mark(Phase::deltanet_proj);
  }

  // The shared expert (and its gate's logit when the router does not give it), on `on`: the
  // window's gate rows [window][shared_ff] at sg, then its up rows.
  void shared_expert(const DeviceLayer& d, cudaStream_t on) {
    const model::Qwen35MoeConfig& c = config;
    float* su = sg + window * c.shared_ff;
    if (d.shared_gate_up.table) {  // window zeros then window ones: the tail of pair_ids' rows and rows
      const int32_t* pairs = pair_ids + (options.step_rows - window);
      grouped("shared expert gate|up", d.shared_gate_up, pairs, 2 * window, normed, c.hidden, sg,
              rows_of(input(0, on), 1), on);
    } else {
      mv("shared expert gate", d.shared_gate, normed, sg, 0, on);
      mv("shared expert up", d.shared_up, normed, su, 0, on);
    }
    mv("shared expert down (SwiGLU inside)", d.shared_down, sg, shared_out, su - sg, on);
    if (!d.router_and_shared_logit.data)
      mv("shared expert's gate logit", d.shared_logit, normed, router_logits + c.n_experts, 0, on, c.n_experts + 1);
  }

  // Each layer's stage for the CPU miss path's dispatch (kernels::MissStage): the prompt pass's
  // staging buffers, where they hold k of its experts (elsewhere none: the products read absent
  // experts in place over PCIe).
  std::vector<kernels::MissStage> miss_stages() const {
    const std::vector<plan::ExpertBytes> sizes = plan::expert_bytes(host);
    const size_t k = size_t(config.n_experts_used);
    std::vector<kernels::MissStage> stages(sizes.size());
    for (size_t l = 0; l < sizes.size() && prompt; ++l) {
      const plan::StagingPieces piece = plan::staging_pieces(host.layers[l].moe);
      if (k * piece.gate_up > prompt->staging_bytes() || k * piece.down > prompt->staging_bytes()) continue;
      stages[l] = {.gate_up = prompt->staging(0), .down = prompt->staging(1), .gate_up_stride = piece.gate_up,
                   .up_at = piece.up_at, .down_stride = piece.down, .gate_bytes = sizes[l].gate,
                   .up_bytes = sizes[l].up, .down_bytes = sizes[l].down,
                   .table = stage_table, .ids = stage_ids, .copies = stage_copies};
    }
    return stages;
  }

  // Whether decode steps hint the CPU miss path (cuda/miss_path.h) which experts it will compute:
  // where it takes misses and the router is the float32 one router_topk computes.
  bool hints() const { return miss && !layers.empty() && layers.front().router.type == GgmlType::F32; }

  // The hint for `layer` (cuda/miss_path.h), on a branch of the step: h as it is now normed for the
  // layer's MoE and routed by its router (counted nowhere), and the absent experts of that routing
  // the CPU would take posted to the host. The branch joins before h is next written
  // (join_hint). Profiling runs it in line.
  void hint_misses(const DeviceLayer& d, int64_t layer) {
    const model::Qwen35MoeConfig& c = config;
    const bool beside = !options.profile;
    cudaStream_t on = beside ? hint_stream : stream;
    if (beside) {
      check_cuda(cudaEventRecord(hint_fork, stream), "forking the miss hint");
      check_cuda(cudaStreamWaitEvent(hint_stream, hint_fork), "forking the miss hint");
    }
    launch(kMissHintNorm,
           [&] { return kernels::rms_norm(h, d.post_norm, hint_normed, 1, int(c.hidden), float(c.rms_eps), on); });
    const DeviceMatrix& r = d.router_and_shared_logit.data ? d.router_and_shared_logit : d.router;
    launch(
        kMissHintRouter,
        [&] {
          return kernels::router_topk(static_cast<const float*>(r.data), int(r.rows), int(r.cols), hint_normed,
                                      hint_logits, int(c.n_experts), int(c.n_experts_used), hint_ids, hint_weights,
                                      RouteTally{}, hint_arrivals, on);
        },
        double(r.rows) * double(r.row_bytes));
    launch(kMissHint, [&] {
      return kernels::miss_hint(miss->link(), hint_ids, int(c.n_experts_used), d.tally.resident, int(layer), on);
    });
    if (beside) check_cuda(cudaEventRecord(hint_join, hint_stream), "joining the miss hint");
    hint_pending = beside;
    mark(Phase::router);
  }
  void join_hint() {
    if (hint_pending) check_cuda(cudaStreamWaitEvent(stream, hint_join), "joining the miss hint");
    hint_pending = false;
  }

  void moe(const DeviceLayer& d, int64_t layer, const float* next_norm) {
    const model::Qwen35MoeConfig& c = config;
    const int64_t k = c.n_experts_used;
    const bool shared = c.shared_ff > 0;
    // The shared expert does not depend on the routing: it runs on a second stream beside the
    // router and the routed experts (a parallel branch of the step's graph; on the H200 247.6
    // tokens/s against 235.1 in one branch), except when profiling, which books each phase's time
    // in order.
    const bool beside = shared && !options.profile;
    if (beside) {
      check_cuda(cudaEventRecord(fork, stream), "forking the shared expert");
      check_cuda(cudaStreamWaitEvent(side_stream, fork), "forking the shared expert");
      shared_expert(d, side_stream);
      check_cuda(cudaEventRecord(join, side_stream), "joining the shared expert");
    }
    // router_logits [window][n_experts + 1]: each row's router logits, then its shared expert's gate.
    const int64_t logit_row = c.n_experts + 1;
    // A step grouped by expert reads an absent expert once a group, not once a routing: its routings
    // are counted apart from those whose products read an expert each.
    const bool grouped = window > 1 && by_expert(d);
    RouteTally tally = d.tally;
    if (grouped && tally.misses) tally.misses += 2 * c.n_layers;
    const float* shared_gate_logit = router_logits + c.n_experts;
    if (d.router.type == GgmlType::F32 && c.hidden % 4 == 0) {
      const DeviceMatrix& r = d.router_and_shared_logit.data ? d.router_and_shared_logit : d.router;
      launch(
          "router",
          [&] {
            return kernels::router_topk(static_cast<const float*>(r.data), int(r.rows), int(r.cols), normed,
                                        router_logits, int(c.n_experts), int(k), ids, weights, tally, router_arrivals,
                                        stream, {window, c.hidden, logit_row});
          },
          double(r.rows) * double(r.row_bytes));
    } else {
      mv("router product", d.router_and_shared_logit.data ? d.router_and_shared_logit : d.router, normed,
         router_logits, 0, nullptr, logit_row);
      launch("router", [&] {
        return kernels::moe_route_window(router_logits, logit_row, int(c.n_experts), int(k), window, ids, weights,
                                         tally, stream);
      });
    }
    // Some absent experts go to the CPU (their ids become -1, which the products skip); the hinted
    // first. The GPU's own absent ones are staged into VRAM, and the products read the chosen
    // experts through the stage's table. (A step of several rows gives the CPU its experts once
    // its rows are grouped by expert, in experts_by_group; the GPU reads its own absent ones over
    // PCIe once a group.)
    const bool cpu_misses = miss && layer < int64_t(layers.size()) &&  // not the MTP block's
                            (window == 1 || (grouped && window <= kernels::kMaxMissRows));
    const bool token_misses = cpu_misses && window == 1;
    const kernels::MissStage stage = token_misses ? stages[size_t(layer)] : kernels::MissStage{};
    const void* const* table = token_misses ? tier->table(layer) : nullptr;
    if (token_misses)
      launch(kMissDispatch, [&] {
        return kernels::miss_dispatch(miss->link(), ids, int(k), d.tally.resident, int(layer), normed, table,
                                      int(c.n_experts), stage, stream);
      });
    // The next layer's hint, from h after this layer's mixer, while the host computes this layer's
    // request and the GPU its share: the host reads ahead once it has answered.
    if (token_misses && hints() && layer + 1 < int64_t(layers.size())) hint_misses(layers[size_t(layer + 1)], layer + 1);
    if (stage.table)
      launch(kMissStage,
             [&] { return kernels::miss_stage(stage, ids, int(k), table, int(c.n_experts), stream); });
    mark(Phase::router);
    const auto through_stage = [&](const DeviceExperts& e, int64_t at) {
      return stage.table ? DeviceExperts{e.type, stage.table + at, e.rows, e.cols, e.row_bytes} : e;
    };
    const int32_t* which = stage.table ? stage.ids : ids;
    if (grouped) {
      experts_by_group(d, cpu_misses ? layer : -1);
    } else {
      routed_experts(d, which, through_stage);
    }
    if (cpu_misses)
      launch(kMissGather,
             [&] { return kernels::miss_gather(miss->link(), y, int(window * k), MissPath::kTimeoutNs, stream); });
    mark(Phase::experts);
    if (beside) {
      check_cuda(cudaStreamWaitEvent(stream, join), "joining the shared expert");
    } else if (shared) {
      shared_expert(d, stream);
      mark(Phase::shared_expert);
    }
    // The expert sum goes straight into the residual, followed by the next norm (none: after the
    // last layer of a step without logits).
    join_hint();
    launch("expert sum, residual and norm", [&] {
      return kernels::moe_combine_add_norm(y, weights, int(k), shared ? shared_out : nullptr, shared_gate_logit,
                                           int(c.hidden), h, next_norm, normed, float(c.rms_eps), stream, window,
                                           logit_row);
    });
    mark(Phase::expert_sum);
  }

  // Whether a step of several rows multiplies the layer's experts by expert groups (each expert
  // read once for all its rows): where the grouped q8 kernels read all three projections' types,
  // and where some experts live in host RAM (grouping saves reads over PCIe) or the step has
  // kGroupedFromRows rows or more. With every expert in VRAM (an H100, the 35B synth, stop 63, per
  // pair against grouped, ms): a window of 2 3.196 / 3.202 against 3.379 / 3.324; of 4 4.966 /
  // 4.960 against 4.801 / 4.751; 4 sequences 4.859 / 4.855 against 4.632 / 4.608; 8 sequences 8.483
  // against 7.488 / 7.471. (From 16 rows before the staged group kernel.)
  static constexpr int kGroupedFromRows = 4;
  bool by_expert(const DeviceLayer& d) const {
    return (!plan.all_resident() || window >= kGroupedFromRows) && options.activations == model::Activations::q8 &&
           has_q8_matvec(d.gate.type) && has_q8_matvec(d.up.type) && has_q8_matvec(d.down.type);
  }

  // The most pairs an expert group takes: 4 with every expert in VRAM (an expert of more pairs is
  // read once per group, and the 4-input kernel keeps fewer sums than the 8-input one: on the H200,
  // the 35B synth, ms a step at 16 / 32 / 64 sequences, 4 against 8: 11.41 / 18.62 / 32.14 against
  // 11.82 / 19.29 / 32.93; 2 lost, 12.21 / 20.87 / 37.91), else 8 (a group's expert crosses PCIe
  // once).
  int group_cap() const { return plan.all_resident() ? 4 : kGroupInputs; }

  // The step's rows' routed experts by expert: the (row, slot) pairs grouped by expert
  // (kernels::expert_groups), then gate and up (one launch where they share a table) and down over
  // the groups, every pair's products the bits of its own problem. With `cpu_layer` (not -1) the
  // CPU miss path takes some absent experts with all their rows first (their groups emptied).
  void experts_by_group(const DeviceLayer& d, int64_t cpu_layer) {
    const model::Qwen35MoeConfig& c = config;
    const int64_t k = c.n_experts_used, ff = c.expert_ff, n = window * k;
    // (An expert has at most one pair a row: a group holds at most the step's rows.)
    const int32_t most = int32_t(std::min<int64_t>(window, group_cap()));
    // (None to count with every expert in VRAM, which spares the step the flags' reads, or for the
    // MTP block.)
    unsigned* absent_groups = d.tally.misses && !plan.all_resident() ? d.tally.misses + 3 * c.n_layers : nullptr;
    launch("expert groups", [&] {
      return kernels::expert_groups(ids, int(n), int(c.n_experts), most, expert_groups, stream, d.tally.resident,
                                    absent_groups);
    });
    if (cpu_layer >= 0)
      launch(kMissDispatch, [&] {
        return kernels::miss_dispatch_rows(miss->link(), ids, window, int(k), d.tally.resident, int(cpu_layer), normed,
                                           int(c.n_experts), expert_groups, int(n), stream, absent_groups);
      });
    MatvecInput in = input();
    in.groups = expert_groups, in.x_run = int32_t(k), in.group_inputs = most;
    float* u = g + n * ff;
    if (d.gate_up.table) {  // gates then ups, one launch (the gates' outputs n pairs before the ups')
      MatvecInput both = in;
      both.group_parts = 2, both.part_entries = c.n_experts;
      grouped("experts gate|up (by expert)", d.gate_up, nullptr, n, normed, c.hidden, g, both);
    } else {
      grouped("experts gate (by expert)", d.gate, nullptr, n, normed, c.hidden, g, in);
      grouped("experts up (by expert)", d.up, nullptr, n, normed, c.hidden, u, in);
    }
    MatvecInput down = input(u - g);  // the SwiGLU applied as the gate and up outputs are read
    down.groups = expert_groups, down.group_inputs = most;
    grouped("experts down (by expert, SwiGLU inside)", d.down, nullptr, n, g, ff, y, down);
  }

  // The routed experts a problem a (row, slot) pair, through the stage's table where the CPU miss
  // path staged them (through_stage).
  template <class ThroughStage>
  void routed_experts(const DeviceLayer& d, const int32_t* which, const ThroughStage& through_stage) {
    const model::Qwen35MoeConfig& c = config;
    const int64_t k = c.n_experts_used, ff = c.expert_ff;
    // The gate|up product asks L2 for the down matrices of its experts once it has read their ids,
    // and the down product, whose ids were written before gate|up ran, reads them and sends for its
    // first rows before it waits for gate|up (on the H200 447.8-448.2 tokens/s against 441.7-441.9;
    // inside the step the down product 5.1 us against 7.0). A window's problems: every row's k
    // gates, then every row's k ups (kernels::moe_route_window's ids); down's are the gates' ids.
    const int64_t n = window * k;  // the window's (row, expert) pairs
    const DeviceExperts down = through_stage(d.down, 2 * k);
    MatvecInput gate_up = rows_of(input(), k);
    gate_up.ahead = {down.table, down.rows * int64_t(down.row_bytes), n};
    float* u = g + n * ff;
    if (d.gate_up.table) {
      grouped("experts gate|up", through_stage(d.gate_up, 0), which, 2 * n, normed, c.hidden, g, gate_up);
    } else {
      grouped("experts gate", through_stage(d.gate, 0), which, n, normed, c.hidden, g, rows_of(input(), k));
      grouped("experts up", through_stage(d.up, k), which, n, normed, c.hidden, u, gate_up);
    }
    // The down projection applies the SwiGLU to the gate (g) and up (u) outputs as it reads them.
    // (Its ids are not read before the wait while kernels are left out: the kernel before it may
    // then not be gate|up.)
    MatvecInput down_input = input(u - g);
    down_input.ids_before_wait = left_out.empty();
    grouped("experts down (SwiGLU inside)", down, which, n, g, ff, y, down_input);
  }

  // Everything of a step after the embedding, on `stream`, reading the position from the device.
  // What a step leaves for the host: nothing (a prompt's inner positions), the logits, or the
  // greedy token chosen on the device (4 bytes to copy instead of the vocabulary's floats).
  enum class StepOutput { none, logits, greedy_token, top_candidates, count };

  void layers_and_head(StepOutput wanted) {
    const bool with_logits = wanted != StepOutput::none;
    const model::Qwen35MoeConfig& c = config;
    const float eps = float(c.rms_eps);
    const int hidden = int(c.hidden);
    // (A share of the layers that takes its rows from the share before gets them normed.)
    if (!options.hand_in)
      launch("norm", [&] { return kernels::rms_norm(h, layers.front().attn_norm, normed, window, hidden, eps, stream); });
    for (size_t l = 0; l < layers.size(); ++l) {
      const DeviceLayer& d = layers[l];
      mark(Phase::norms);
      // The first layer's hint from the embedding, beside the mixer (later layers': in moe()).
      if (l == 0 && hints() && window == 1) hint_misses(d, 0);
      d.recurrent ? deltanet(d, (*stepping)[l]) : attention(d, (*stepping)[l], device_positions);
      join_hint();
      // Each residual add is fused with the norm that reads its result.
      launch("residual and norm",
             [&] { return kernels::add_rms_norm(h, mixed, d.post_norm, normed, window, hidden, eps, stream); });
      mark(Phase::norms);
      const bool normed_out = with_logits || hands_on();
      moe(d, int64_t(l), l + 1 < layers.size() ? layers[l + 1].attn_norm : normed_out ? output_norm : nullptr);
    }
    if (!with_logits) return;
    mv("lm head", output, normed, logits);
    if (wanted == StepOutput::greedy_token)
      launch(
          "greedy token",
          [&] {
            return kernels::greedy_token(logits, int(c.vocab), greedy_partials, plan::kGreedyBlocks, greedy_arrivals,
                                         device_token, stream, window);
          },
          double(window) * double(c.vocab) * sizeof(float));
    if (wanted == StepOutput::top_candidates)
      launch("ids set aside", [&] {
        return kernels::set_aside(logits, int(c.vocab), top_aside + options.step_rows, top_aside,
                                  sample::kTopAsideMost, top_aside_logits, stream, window);
      });
    if (wanted == StepOutput::top_candidates)  // into the greedy pick's scratch: [rows][64] pairs, [rows] counts
      launch(
          "top candidates",
          [&] {
            return kernels::top_candidates(logits, int(c.vocab), sample::kTopCandidates, top_scratch,
                                           static_cast<kernels::TopPair*>(greedy_partials), device_token, stream,
                                           window);
          },
          double(window) * double(c.vocab) * sizeof(float));
    mark(Phase::lm_head);  // with the greedy pick or the top candidates
  }

  // What queue() queues on the stream, captured as a graph into `exec` the first time and replayed
  // after (profiling queues it directly, to time it).
  template <class Queue>
  void replay(cudaGraphExec_t& exec, const char* what, Queue&& queue) {
    if (options.profile) return queue();
    capture(exec, what, queue);
    check_cuda(cudaGraphLaunch(exec, stream), what);
  }

  // What queue() queues on the stream captured as a graph into `exec`, unless it holds one, and
  // uploaded to the device: nothing runs. A queue() that fails ends the capture (the stream stays
  // usable) and throws on.
  template <class Queue>
  void capture(cudaGraphExec_t& exec, const char* what, Queue&& queue) {
    if (exec) return;
    cudaGraph_t graph = nullptr;
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), what);
    try {
      queue();
    } catch (...) {
      if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    check_cuda(cudaStreamEndCapture(stream, &graph), what);
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check_cuda(made, what);
    check_cuda(cudaGraphUpload(exec, stream), what);
    ++graphs_captured;
  }
  int64_t graphs_captured = 0;

  // The graphs the current sequence's coming steps replay (CudaSession::ready_steps), captured
  // now. The keys are those its steps use: a one-token step's or a window's of the sequence's own
  // states (a top-candidates step: of a decode_rows step's), a cut by its row, the block's by rows.
  void ready_steps(const CudaSession::StepsAhead& ahead) {
    if (options.profile) return;
    using Output = CudaSession::StepsAhead::Output;
    const int64_t most = std::clamp<int64_t>(ahead.window, 1, std::max<int64_t>(window_rows(), 1));
    for (int64_t n = 1; n <= most; ++n) {
      const bool top = ahead.output == Output::top && n == 1;  // (windows take their logits)
      const StepOutput wanted = hands_on()                         ? StepOutput::none
                                : top                              ? StepOutput::top_candidates
                                : ahead.output == Output::greedy ? StepOutput::greedy_token
                                                                   : StepOutput::logits;
      stepping = top ? &states : &sequence_states(current);
      const WindowRows rows(*this, n, n > 1);
      capture(step_graph(wanted), "readying a step", [&] { layers_and_head(wanted); });
    }
    for (int64_t row = 1; row < most; ++row)
      capture(cuts[{current, row}], "readying a cut", [&] { queue_cut(row); });
    if (!ahead.drafts || !mtp) return;
    for (int64_t n = 1; n <= most; ++n) {
      const WindowRows rows(*this, n);
      capture(mtp->draft_rows[size_t(n - 1)], "readying a draft step", [&] { mtp_draft_step(); });
      capture(mtp->append[size_t(n - 1)], "readying the MTP block's rows", [&] { mtp_rows_kv(); });
    }
  }

  // The rows the launches queued in its lifetime take (Impl::window), and whether they are a window
  // that keeps its states (Impl::keeping); one row, kept nothing, again after.
  struct WindowRows {
    Impl& s;
    WindowRows(Impl& impl, int64_t n, bool keep = false) : s(impl) { s.window = int(n), s.keeping = keep && n > 1; }
    ~WindowRows() { s.window = 1, s.keeping = false; }
  };

  // The current sequence back to the DeltaNet states kept before the step's row j (a cut of its
  // window: Place::window_row + the tokens it keeps, at least 1) copied back.
  void queue_cut(int64_t j) {
    const size_t conv = size_t(conv_floats()), recurrent = size_t(recurrent_floats());
    const int64_t at = j - 1;  // (kernels::TokenRows::kept: nothing is kept before row 0)
    for (const LayerState& st : sequence_states(current)) {
      if (!st.conv_state) continue;
      check_cuda(cudaMemcpyAsync(st.conv_state, st.conv_kept + at * int64_t(conv), conv * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream),
                 "cutting a window");
      check_cuda(cudaMemcpyAsync(st.ssm_state, st.ssm_kept + at * int64_t(recurrent), recurrent * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream),
                 "cutting a window");
    }
  }
  std::map<std::pair<int64_t, int64_t>, cudaGraphExec_t> cuts;  // (sequence, row j): queue_cut(j), made on first use

  // The step captured once as a CUDA graph (one for each number of rows, whether they keep states,
  // and StepOutput) and replayed: one launch instead of ~700. What the rows are (their sequences
  // and positions) the graph reads from the device. Profiling runs the kernels directly, to time them.
  void run_step(StepOutput wanted) { replay(step_graph(wanted), "a step", [&] { layers_and_head(wanted); }); }
  // The graph of the step that stepping, keeping and window now describe, giving `wanted`.
  cudaGraphExec_t& step_graph(StepOutput wanted) {
    return graphs[{stepping == &states ? -1 : current, keeping, window, int(wanted)}];
  }

  // One position of the current sequence: token in; out, as `wanted`, the logits into logits_out,
  // or the greedy token (returned), or nothing (-1 returned).
  int32_t step(int32_t token, StepOutput wanted, float* logits_out = nullptr) {
    int32_t greedy = -1;
    step(std::span(&token, 1), {}, wanted, logits_out, &greedy, nullptr);
    return greedy;
  }

  // Each row's sequence (`sequences`: a sequence's rows consecutive, its next tokens in order;
  // empty: all the current sequence's, a window), checked; its position.
  std::vector<int64_t> row_positions(std::span<const int32_t> tokens, std::span<const int64_t> sequences) const {
    const int64_t n = int64_t(tokens.size());
    std::vector<int64_t> positions(static_cast<size_t>(n));
    if (sequences.empty()) {
      if (place().position + n > options.max_context)
        fail("cuda session: the context of {} positions is full; raise max_context", options.max_context);
      for (int64_t t = 0; t < n; ++t) positions[size_t(t)] = place().position + t;
      return positions;
    }
    std::vector<bool> seen(places.size(), false);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t q = sequences[size_t(t)];
      if (q < 0 || q >= int64_t(places.size()))
        fail("cuda session: row {} names sequence {}; this session holds {}", t, q, places.size());
      const bool continues = t > 0 && sequences[size_t(t - 1)] == q;  // the run's next token
      if (seen[size_t(q)] && !continues)
        fail("cuda session: sequence {} has rows apart in one step (a sequence's rows must be consecutive)", q);
      seen[size_t(q)] = true;
      positions[size_t(t)] = continues ? positions[size_t(t - 1)] + 1 : places[size_t(q)].position;
      if (positions[size_t(t)] + 1 > options.max_context)
        fail("cuda session: sequence {}'s context of {} positions is full; raise max_context", q, options.max_context);
    }
    return positions;
  }

  // After a step of several sequences' rows: each sequence `rows` positions on, where it had that
  // many; with `kept`, each one's rows a window that cut_window can cut (and any other sequence's
  // window no longer: the step wrote over the kept states).
  void advance_runs(std::span<const int64_t> sequences, bool kept) {
    if (kept)
      for (Place& other : places) other.window_start = -1;
    for (size_t r = 0, end = 0; r < sequences.size(); r = end) {
      for (end = r + 1; end < sequences.size() && sequences[end] == sequences[r];) ++end;
      Place& at = places[size_t(sequences[r])];
      const int64_t rows = int64_t(end - r);
      at.window_start = kept ? at.position : -1, at.window_tokens = rows, at.window_row = int64_t(r);
      at.position += rows;
    }
  }

  // The rows' ids set aside to the device (their counts, and where there are any, the ids): whether
  // there are any.
  bool stage_aside(std::span<const std::span<const int32_t>> aside, int n) {
    int32_t* counts = pinned_aside;
    int32_t* ids = pinned_aside + options.step_rows;
    bool any = false;
    for (int r = 0; r < n; ++r) {
      const std::span<const int32_t> row = size_t(r) < aside.size() ? aside[size_t(r)] : std::span<const int32_t>();
      counts[r] = int32_t(row.size());
      std::copy(row.begin(), row.end(), ids + size_t(r) * sample::kTopAsideMost);
      any = any || !row.empty();
    }
    const size_t bytes = any ? size_t(options.step_rows + n * sample::kTopAsideMost) * sizeof(int32_t) : n * sizeof(int32_t);
    check_cuda(cudaMemcpyAsync(top_aside, pinned_aside, bytes, cudaMemcpyHostToDevice, stream), "ids set aside to the device");
    return any;
  }

  // Tokens in one step, each row computed as a one-token step of its sequence computes it: rows of
  // several sequences (`sequences`, a row's own; a sequence's rows consecutive, its next tokens in
  // order), or with `sequences` empty the current sequence's next tokens. Where a sequence has
  // several rows (a verify window; with `sequences` empty, always) the step keeps the DeltaNet
  // states before each of its rows but the first, for cut_window.
  // Out, as `wanted`, each row's logits [n][vocab] into logits_out or its greedy token into
  // greedy_out [n] (-1 where there is none), and each row's final-normed hidden state [n][hidden]
  // into hidden_out when it is not null (not with StepOutput::none).
  // With top candidates, `aside` holds each row's ids set aside (Row::aside), and aside_out gets
  // them with their logits.
  void step(std::span<const int32_t> tokens, std::span<const int64_t> sequences, StepOutput wanted, float* logits_out,
            int32_t* greedy_out, float* hidden_out, sample::Scored* top_out = nullptr, int32_t* finite_out = nullptr,
            std::span<const std::span<const int32_t>> aside = {},
            std::vector<std::vector<sample::Scored>>* aside_out = nullptr) {
    const model::Qwen35MoeConfig& c = config;
    const int n = int(tokens.size());
    if (hands_on()) wanted = StepOutput::none, hidden_out = nullptr;  // (no lm head here: the rows go on)
    assert(wanted != StepOutput::logits || logits_out);
    assert(!hidden_out || wanted != StepOutput::none);
    if (n < 1 || n > options.step_rows)
      fail("cuda session: a step of {} tokens; this session takes 1 to {} (step_rows)", n, options.step_rows);
    for (int32_t token : tokens)
      if (token < 0 || token >= c.vocab) fail("cuda session: token id {} is outside the vocabulary [0, {})", token, c.vocab);
    bool windows = sequences.empty();  // whether the step keeps its rows' states
    for (size_t r = 1; r < sequences.size(); ++r) windows = windows || sequences[r] == sequences[r - 1];
    if (windows && n > window_rows())
      fail("cuda session: verify windows of {} tokens in a step; this session keeps states for windows of at most {} "
           "(window_rows)", n, window_rows());
    const std::vector<int64_t> positions = row_positions(tokens, sequences);
    if (sequences.empty()) prepare_kv(current, positions.front(), positions.front() + n);
    for (size_t r = 0; r < sequences.size(); ++r)  // a sequence's rows from its position to its last row's
      if (r + 1 == sequences.size() || sequences[r + 1] != sequences[r])
        prepare_kv(sequences[r], places[size_t(sequences[r])].position, positions[r] + 1);
    clock.start();
    const auto started = std::chrono::steady_clock::now();
    for (int t = 0; t < n; ++t) {
      if (!options.hand_in) model::dequantize_row(host.token_embd, tokens[size_t(t)], pinned_embedding + t * c.hidden);
      pinned_positions[t] = positions[size_t(t)];
      pinned_sequences[t] = int32_t(sequences.empty() ? current : sequences[size_t(t)]);
    }
    // The rows' sequences, positions and embeddings in one copy (plan::DecodeScratch lays them out
    // one after another, and the pinned stage likewise); rows handed in are in h already.
    const size_t header = scratch_layout.h - scratch_layout.sequences;
    const size_t embeddings = options.hand_in ? 0 : size_t(n * c.hidden) * sizeof(float);
    check_cuda(cudaMemcpyAsync(device_sequences, pinned_sequences, header + embeddings, cudaMemcpyHostToDevice, stream),
               "a step's rows to the device");
    const bool setting_aside = wanted == StepOutput::top_candidates && stage_aside(aside, n);
    mark(Phase::embedding);
    if (timing_kernels()) kernel_clock.begin(stream);
    stepping = sequences.empty() ? &sequence_states(current) : &states;
    {
      const WindowRows rows(*this, n, windows);
      run_step(wanted);
    }
    if (wanted == StepOutput::logits)
      check_cuda(cudaMemcpyAsync(pinned_logits, logits, size_t(n * c.vocab) * sizeof(float), cudaMemcpyDeviceToHost, stream),
                 "logits to the host");
    if (wanted == StepOutput::greedy_token || wanted == StepOutput::top_candidates)
      check_cuda(cudaMemcpyAsync(pinned_token, device_token, size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
                 wanted == StepOutput::greedy_token ? "the greedy token to the host" : "finite counts to the host");
    const size_t top_bytes = size_t(n) * sample::kTopCandidates * sizeof(kernels::TopPair);
    if (wanted == StepOutput::top_candidates)  // (pinned_logits holds 64 pairs a row at least)
      check_cuda(cudaMemcpyAsync(pinned_logits, greedy_partials, top_bytes, cudaMemcpyDeviceToHost, stream),
                 "top candidates to the host");
    if (setting_aside)
      check_cuda(cudaMemcpyAsync(pinned_aside_logits, top_aside_logits, size_t(n) * sample::kTopAsideMost * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream),
                 "logits set aside to the host");
    if (hidden_out)
      check_cuda(cudaMemcpyAsync(pinned_hidden, normed, size_t(n * c.hidden) * sizeof(float), cudaMemcpyDeviceToHost, stream),
                 "hidden states to the host");
    const bool arms = arming.drafts && wanted == StepOutput::greedy_token;
    if (arms) queue_armed(*arming.drafts, arming.window);
    check_cuda(cudaStreamSynchronize(stream), "a step");
    mark(Phase::output_copy);
    if (timing_kernels()) kernel_clock.settle();
    if (wanted == StepOutput::logits) std::copy_n(pinned_logits, n * c.vocab, logits_out);
    if (wanted == StepOutput::greedy_token) std::copy_n(pinned_token, n, greedy_out);
    if (wanted == StepOutput::top_candidates) {
      const auto* pairs = reinterpret_cast<const kernels::TopPair*>(pinned_logits);
      for (size_t i = 0; i < size_t(n) * sample::kTopCandidates; ++i) top_out[i] = {pairs[i].id, pairs[i].logit};
      // (A step timed without some launches has meaningless outputs: no candidates, not stale ones.)
      for (int r = 0; r < n; ++r) finite_out[r] = left_out.empty() ? pinned_token[r] : -1;
      if (aside_out) {
        aside_out->assign(size_t(n), {});
        for (size_t r = 0; r < aside.size() && setting_aside; ++r)
          for (size_t i = 0; i < aside[r].size(); ++i)
            (*aside_out)[r].push_back({aside[r][i], pinned_aside_logits[r * sample::kTopAsideMost + i]});
      }
    }
    if (hidden_out) std::copy_n(pinned_hidden, n * c.hidden, hidden_out);
    if (arms) std::copy_n(pinned_token + options.step_rows, n, arming.out);
    if (arms && arming.drafts->continues) *arming.continued = pinned_token[2 * options.step_rows];
    if (sequences.empty()) {
      // One set of kept states: a window of this sequence's overwrites another's, which can no
      // longer be cut.
      if (n > 1)
        for (Place& other : places) other.window_start = -1;
      place().window_start = n > 1 ? place().position : -1, place().window_tokens = n, place().window_row = 0;
      place().position += n;
    } else {
      advance_runs(sequences, windows && n > 1);
    }
    // (The split follows one-token steps' times only.)
    if (miss)
      miss->after_step(n == 1 ? std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() : -1,
                       stream);
    tier->between_steps(stream);
  }

  // Fails for a row without a greedy token (-1: NaN or +inf logits, or all -inf), unless launches
  // were left out (whose steps compute nothing meaningful).
  void check_greedy(std::span<const int32_t> greedy) const {
    for (int32_t next : greedy)
      if (next < 0 && left_out.empty())
        fail("cuda session: a row's logits hold NaN or +inf, or are all -inf, so there is no greedy token (a "
             "damaged model file?)");
  }

  // The MTP block (options.mtp): its layer bound as a main layer is, its experts all in VRAM behind
  // a table of its own, its K/V cache in kv::mtp_format, its rows in the decode scratch. Each
  // sequence has its own cache (as the memory plan counts it: every sequence's whole context), so
  // the drafters of sequences that decode together keep their rows; a sequence's cache rows are
  // dense from the first position its drafter followed; the rotation adds `shift`.
  struct Mtp {
    DeviceLayer layer;
    LayerState rows_state;           // every sequence's cache, a row's sequence read on the device
    int64_t* shifts = nullptr;       // device: [step_rows] what each row's rotary position adds
    // (The rows' sequences and K/V rows in the step's device_sequences and device_positions.)
    std::unique_ptr<KvCache> kv;
    DeviceMatrix eh_proj;
    const float *enorm = nullptr, *hnorm = nullptr, *head_norm = nullptr;
    float* rows = nullptr;            // [step_rows][2 hidden]: embedding | hidden state
    // The token embedding table on the device (data null where the GPU cannot expand its type: no
    // drafts armed then), and [step_rows][hidden] for a verify step that arms drafts (queue_armed:
    // its greedy tokens' embeddings, then the block's outputs); how many such steps ran.
    DeviceMatrix embedding;
    float* armed = nullptr;
    int64_t armed_windows = 0;
    // Where such a step that continues (WindowDrafts::continues) keeps the tokens the window keeps
    // and its continued row's token (kernels::window_kept, mtp_continued_row).
    int32_t *kept = nullptr, *continued_id = nullptr;
    // Graphs captured on first use, of any sequences (rows_state): [n - 1] n rows' K/V; [n - 1] a
    // draft step of n sequences' rows.
    std::vector<cudaGraphExec_t> append;
    std::vector<cudaGraphExec_t> draft_rows;
  };
  std::unique_ptr<Mtp> mtp;

  void bind_mtp(const plan::DecodeScratch& scratch, uint8_t* base) {
    const model::MtpWeights& w = *host.mtp;
    const model::Qwen35MoeConfig& c = config;
    mtp = std::make_unique<Mtp>();
    Mtp& m = *mtp;
    m.enorm = upload(w.enorm, "mtp enorm"), m.hnorm = upload(w.hnorm, "mtp hnorm");
    m.head_norm = upload(w.shared_head_norm, "mtp shared_head_norm");
    m.eh_proj = matrix(w.eh_proj);
    m.layer = bind_trunk(w.layer, "mtp ");
    const model::MoeWeights& e = w.layer.moe;
    std::vector<const void*> pointers;
    for (const model::ExpertStack* s : {&e.gate, &e.up, &e.down})
      for (int64_t x = 0; x < c.n_experts; ++x) pointers.push_back(device_of(s->expert(x).data, VramUse::weights));
    const void* const* t = table_of(pointers, "mtp experts");
    const int64_t n = c.n_experts;
    m.layer.gate = experts_of(e.gate.first, t), m.layer.up = experts_of(e.up.first, t + n);
    m.layer.down = experts_of(e.down.first, t + 2 * n);
    if (model::same_shape(e.gate.first, e.up.first)) m.layer.gate_up = m.layer.gate;
    const int64_t sequences = options.sequences;
    m.kv = std::make_unique<KvCache>(vram, kv::mtp_format(c.head_dim, options.kv_format), 1, c.n_kv_heads, c.head_dim,
                                     options.max_context, std::vector<int32_t>{}, sequences);
    for (int64_t q = 0; q < sequences; ++q)
      m.kv->prepare_write(q, 0, options.max_context);  // every page mapped: the block's rows go straight in
    m.rows_state.kv = m.kv->layer(0, 0);
    m.rows_state.kv.row_sequence = device_sequences, m.rows_state.kv.pages_stride = m.kv->pages_per_sequence();
    m.append.assign(size_t(options.step_rows), nullptr);
    m.draft_rows.assign(size_t(options.step_rows), nullptr);
    m.rows = reinterpret_cast<float*>(base + scratch.mtp_rows);
    m.shifts = reinterpret_cast<int64_t*>(base + scratch.mtp_shifts);
    m.armed = reinterpret_cast<float*>(base + scratch.mtp_armed);
    m.kept = reinterpret_cast<int32_t*>(base + scratch.mtp_continue), m.continued_id = m.kept + 1;
    const model::MatrixView& table = host.token_embd;  // (one upload where the lm head is it)
    if (expandable(table.type->type, table.cols))
      m.embedding = {table.type->type, device_of(table.data, VramUse::weights), table.rows, table.cols, table.row_bytes};
  }

  // Pinned staging of the MTP block's rows, room for `pieces` pieces of step_rows rows (their
  // embeddings and states, sequences, K/V rows and shifts) at once: a call stages every piece
  // first, since the stream copies each later (mtp_row_inputs).
  struct MtpStage {
    float* rows = nullptr;         // [pieces][step_rows][2 hidden]
    int64_t* positions = nullptr;  // [pieces][step_rows] K/V rows, then [pieces][step_rows] shifts
    int32_t* sequences = nullptr;  // [pieces][step_rows]
    int64_t pieces = 0;
  } mtp_stage;
  void free_mtp_stage() {
    cudaFreeHost(mtp_stage.rows), cudaFreeHost(mtp_stage.positions), cudaFreeHost(mtp_stage.sequences);
    mtp_stage = {};
  }
  void mtp_stage_for(int64_t pieces) {
    if (pieces <= mtp_stage.pieces) return;
    pieces = std::max(pieces, 2 * mtp_stage.pieces);  // (growing synchronises the device: rarely)
    free_mtp_stage();
    const size_t rows = size_t(pieces * options.step_rows);
    check_cuda(cudaMallocHost(&mtp_stage.rows, rows * size_t(2 * config.hidden) * sizeof(float)), "pinned memory");
    check_cuda(cudaMallocHost(&mtp_stage.positions, 2 * rows * sizeof(int64_t)), "pinned memory");
    check_cuda(cudaMallocHost(&mtp_stage.sequences, rows * sizeof(int32_t)), "pinned memory");
    mtp_stage.pieces = pieces;
  }

  // The block's layer input for the window's rows in m.rows: both halves normed, eh_proj into h,
  // the layer's norm into normed.
  void mtp_layer_input() {
    const model::Qwen35MoeConfig& c = config;
    const int hd = int(c.hidden);
    const float eps = float(c.rms_eps);
    Mtp& m = *mtp;
    launch("MTP norms", [&] { return kernels::rms_norm(m.rows, m.enorm, m.rows, 2 * window, hd, eps, stream, m.hnorm); });
    mv("MTP eh_proj", m.eh_proj, m.rows, h);
    launch("MTP norms", [&] { return kernels::rms_norm(h, m.layer.attn_norm, normed, window, hd, eps, stream); });
  }

  // The block's K/V rows for the window's rows in m.rows (mtp_append: tokens followed, nothing drafted).
  void mtp_rows_kv() {
    mtp_layer_input();
    attention_kv(mtp->layer, mtp->rows_state, device_positions, mtp->shifts);
  }

  // The rows of a draft step over several sequences (mtp_draft_rows) staged: each row's embedding
  // and the hidden state it pairs with (host memory, [n][hidden]; null: the rows' outputs of the
  // draft step before, in normed), its sequence, K/V row and rotary shift.
  // (staged as piece p of mtp_stage: a caller that stages several pieces calls mtp_stage_for first)
  void mtp_row_inputs(std::span<const int64_t> sequences, std::span<const int32_t> tokens, const float* hidden,
                      std::span<const int64_t> rows, std::span<const int64_t> shifts, int64_t p = 0) {
    const int64_t hd = config.hidden, n = int64_t(tokens.size()), at = p * options.step_rows;
    const size_t row_bytes = size_t(hd) * sizeof(float);
    Mtp& m = *mtp;
    float* stage = mtp_stage.rows + at * 2 * hd;
    int64_t* positions = mtp_stage.positions + at;
    int64_t* shifted = mtp_stage.positions + mtp_stage.pieces * options.step_rows + at;
    int32_t* of = mtp_stage.sequences + at;
    for (int64_t t = 0; t < n; ++t) {
      model::dequantize_row(host.token_embd, tokens[size_t(t)], stage + t * 2 * hd);
      if (hidden) std::copy_n(hidden + t * hd, hd, stage + t * 2 * hd + hd);
      of[t] = int32_t(sequences[size_t(t)]), positions[t] = rows[size_t(t)], shifted[t] = shifts[size_t(t)];
    }
    const auto check = [](cudaError_t e) { check_cuda(e, "the MTP block's rows"); };
    if (hidden) {
      check(cudaMemcpyAsync(m.rows, stage, 2 * n * row_bytes, cudaMemcpyHostToDevice, stream));
    } else {  // the embeddings from the host, the states the last draft step's outputs
      check(cudaMemcpy2DAsync(m.rows, 2 * row_bytes, stage, 2 * row_bytes, row_bytes, size_t(n),
                              cudaMemcpyHostToDevice, stream));
      check(cudaMemcpy2DAsync(m.rows + hd, 2 * row_bytes, normed, row_bytes, row_bytes, size_t(n),
                              cudaMemcpyDeviceToDevice, stream));
    }
    check(cudaMemcpyAsync(device_sequences, of, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    check(cudaMemcpyAsync(device_positions, positions, size_t(n) * sizeof(int64_t), cudaMemcpyHostToDevice, stream));
    check(cudaMemcpyAsync(m.shifts, shifted, size_t(n) * sizeof(int64_t), cudaMemcpyHostToDevice, stream));
  }

  // One draft step: the block's forward for the window's rows in m.rows (mtp_row_inputs' sequences,
  // K/V rows and shifts), its outputs (shared_head_norm) left in normed, its logits in logits and
  // each row's greedy token in device_token.
  void mtp_draft_step() {
    const model::Qwen35MoeConfig& c = config;
    Mtp& m = *mtp;
    mtp_layer_input();
    attention(m.layer, m.rows_state, device_positions, m.shifts);
    launch("MTP residual and norm", [&] {
      return kernels::add_rms_norm(h, mixed, m.layer.post_norm, normed, window, int(c.hidden), float(c.rms_eps), stream);
    });
    moe(m.layer, int64_t(layers.size()), m.head_norm);
    mv("lm head", output, normed, logits);
    launch("greedy token", [&] {
      return kernels::greedy_token(logits, int(c.vocab), greedy_partials, plan::kGreedyBlocks, greedy_arrivals,
                                   device_token, stream, window);
    });
  }

  // Set by decode_window around the step it runs: the drafts to arm after the window
  // (CudaSession::WindowDrafts), the window's tokens, and where the drafts go, [rows], and the
  // draft continued to.
  struct Arming {
    const CudaSession::WindowDrafts* drafts = nullptr;
    std::span<const int32_t> window{};
    int32_t* out = nullptr;
    int32_t* continued = nullptr;
  } arming;

  // After a greedy verify window's step, its greedy tokens in device_token and its final-normed
  // states in normed (both already queued to the host): the MTP block over its n rows, row t's
  // greedy token's embedding (looked up here, on the device) paired with row t's state, at the
  // drafter's K/V rows first_row + t; the block's outputs kept in armed for the drafts after, its
  // greedy tokens queued to the host after the window's.
  void queue_armed(const CudaSession::WindowDrafts& d, std::span<const int32_t> tokens) {
    const int n = int(tokens.size());
    const int64_t hd = config.hidden;
    Mtp& m = *mtp;
    const auto check = [](cudaError_t e) { check_cuda(e, "drafts armed in a verify step"); };
    if (d.continues) {  // the tokens kept, before the block's greedy tokens take the window's place
      kernels::WindowTokens window{.n = n};
      std::copy(tokens.begin(), tokens.end(), window.tokens);
      launch("MTP rows kept", [&] { return kernels::window_kept(device_token, window, m.kept, stream); });
    }
    const DeviceMatrix& e = m.embedding;
    if (const char* error = dequantize(e.type, e.data, nullptr, device_token, n, 1, e.cols, e.row_bytes, m.armed, stream))
      fail("drafts armed in a verify step: looking up embeddings: {}", error);
    const kernels::MtpRowPlaces places{int32_t(d.sequence), d.first_row, d.shift};
    launch("MTP rows", [&] {
      return kernels::mtp_window_rows(m.armed, normed, n, int(hd), places, m.rows, device_sequences, device_positions,
                                      m.shifts, stream);
    });
    const size_t row_bytes = size_t(hd) * sizeof(float);
    {
      const WindowRows window(*this, n);
      replay(m.draft_rows[size_t(n - 1)], "a draft step of several sequences", [&] { mtp_draft_step(); });
    }
    check(cudaMemcpyAsync(m.armed, normed, size_t(n) * row_bytes, cudaMemcpyDeviceToDevice, stream));
    check(cudaMemcpyAsync(pinned_token + options.step_rows, device_token, size_t(n) * sizeof(int32_t),
                          cudaMemcpyDeviceToHost, stream));
    if (d.continues) queue_continued(d, n);
    ++m.armed_windows;
  }

  // After queue_armed's block over a window's n rows: the draft step that continues from the row
  // of the last token the window keeps (m.kept, on the device), its token that row's draft and its
  // state that row's output, at the K/V row after it, as the drafter's next step would run it; its
  // output kept in armed row n (for the drafts after it), its token queued to the host after the
  // window's drafts.
  void queue_continued(const CudaSession::WindowDrafts& d, int n) {
    const int64_t hd = config.hidden;
    Mtp& m = *mtp;
    const auto check = [](cudaError_t e) { check_cuda(e, "a draft continued in a verify step"); };
    const kernels::MtpRowPlaces places{int32_t(d.sequence), d.first_row, d.shift};
    launch("MTP continued row", [&] {
      return kernels::mtp_continued_row(m.kept, m.armed, device_token, int(hd), places, m.rows, m.continued_id,
                                        device_sequences, device_positions, m.shifts, stream);
    });
    const DeviceMatrix& e = m.embedding;
    if (const char* error = dequantize(e.type, e.data, nullptr, m.continued_id, 1, 1, e.cols, e.row_bytes, m.rows, stream))
      fail("a draft continued in a verify step: looking up its embedding: {}", error);
    {
      const WindowRows window(*this, 1);
      replay(m.draft_rows[0], "a draft step of several sequences", [&] { mtp_draft_step(); });
    }
    check(cudaMemcpyAsync(m.armed + n * hd, normed, size_t(hd) * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    check(cudaMemcpyAsync(pinned_token + 2 * options.step_rows, device_token, sizeof(int32_t), cudaMemcpyDeviceToHost,
                          stream));
  }

  // The CPU miss path, where decode steps can miss and options.miss_path allows it.
  void create_miss_path() {
    const plan::MissPath path = options.miss_path;
    if (path == plan::MissPath::gpu) return void(miss_summary = "gpu (absent experts read over PCIe)");
    if (plan.experts_resident == config.n_layers * config.n_experts)
      return void(miss_summary = "none (every expert is in VRAM)");
    const std::string why = options.activations != model::Activations::q8
                                ? "it reproduces the GPU's 8-bit products (--activations q8)"
                            : config.hidden % 4 != 0 ? "its hidden size is not a multiple of 4"
                                                     : cpu::HostExperts::unsupported(host);
    if (!why.empty()) {
      if (path == plan::MissPath::cpu) fail("--miss-path cpu cannot run this model: {}", why);
      return void(miss_summary = fmt::format("gpu (the CPU cannot take misses: {})", why));
    }
    miss = std::make_unique<MissPath>(host, path, miss_words, stream);
    stages = miss_stages();
    miss_summary = fmt::format("{}; {}", plan::to_string(path), miss->describe());
  }

  // Before a prompt runs at a sequence's position (the current one's unless named): checked, then
  // mapped (map_prompt).
  void start_prompt(std::span<const int32_t> tokens) { start_prompt(current, tokens); }
  void start_prompt(int64_t sequence, std::span<const int32_t> tokens) {
    check_prompt(sequence, tokens);
    map_prompt(sequence, tokens);
  }
  // Its tokens against the vocabulary and the context left, changing nothing.
  void check_prompt(int64_t sequence, std::span<const int32_t> tokens) const {
    const Place& at = places[size_t(sequence)];
    for (int32_t token : tokens)
      if (token < 0 || token >= config.vocab)
        fail("cuda session: token id {} is outside the vocabulary [0, {})", token, config.vocab);
    if (at.position + int64_t(tokens.size()) > options.max_context)
      fail("cuda session: a prompt of {} tokens after {} does not fit the context of {} positions; raise max_context",
           tokens.size(), at.position, options.max_context);
  }
  // Prompt pieces of several sequences: every one checked before any is mapped, so that a refused
  // piece changes nothing.
  void start_pieces(std::span<const CudaSession::Piece> pieces) {
    for (const CudaSession::Piece& p : pieces) check_prompt(p.sequence, p.tokens);
    for (const CudaSession::Piece& p : pieces) map_prompt(p.sequence, p.tokens);
  }
  // The last window no longer cut, the prompt's K/V pages mapped.
  void map_prompt(int64_t sequence, std::span<const int32_t> tokens) {
    Place& at = places[size_t(sequence)];
    at.window_start = -1;
    prepare_kv(sequence, at.position, at.position + int64_t(tokens.size()));
  }

  // A prompt of several tokens, chunk by chunk through the prompt pass; logits of every position
  // into `out` when all_logits, else of the last.
  // With hidden, every position's final-normed hidden state into it ([n][hidden]).
  void prefill_chunks(std::span<const int32_t> tokens, bool all_logits, float* out, float* hidden_out = nullptr) {
    start_prompt(tokens);
    const size_t chunk = size_t(prompt->chunk());
    for (size_t at = 0; at < tokens.size(); at += chunk) {
      const size_t n = std::min(chunk, tokens.size() - at);
      prompt_chunk(tokens.subspan(at, n), all_logits, at + n == tokens.size(),
                   out + (all_logits ? int64_t(at) * config.vocab : 0), hidden_out ? hidden_out + int64_t(at) * config.hidden : nullptr);
    }
  }

  // One chunk of a prompt at the current position (its K/V pages mapped), through the prompt pass:
  // its embeddings in (unless its rows are handed in); the logits of every row (all_logits) or of
  // the last (last_logits) into out, [rows][vocab] or [vocab] (a share that hands its rows on has no
  // lm head); with hidden_out, every row's final-normed hidden state.
  void prompt_chunk(std::span<const int32_t> tokens, bool all_logits, bool last_logits, float* out, float* hidden_out) {
    const int64_t n = int64_t(tokens.size()), position = place().position;
    embed_prompt_rows(tokens, 0);
    *pinned_positions = position;
    check_cuda(cudaMemcpyAsync(device_positions, pinned_positions, sizeof(int64_t), cudaMemcpyHostToDevice, stream),
               "position to the device");
    const PromptSegment segment{&sequence_states(current), n, 0, device_positions, position};
    prompt->run(std::span(&segment, 1));
    if (hidden_out) prompt_hidden(0, n, hidden_out);
    for (int64_t t = all_logits ? 0 : n - 1; t < n && (all_logits || last_logits) && !hands_on(); ++t)
      prompt_logits(t, out + (all_logits ? t : 0) * config.vocab);
    check_cuda(cudaStreamSynchronize(stream), "a prompt chunk");
    place().position += n;
  }

  // Prompt pieces of several sequences in one pass (CudaSession::prefill_pieces), each checked and
  // mapped as a prompt first; rows as prompt_row_starts lays them out.
  void prompt_pieces(std::span<const CudaSession::Piece> pieces, std::vector<CudaSession::PieceOutput>& outputs) {
    std::vector<int64_t> lengths;
    for (const CudaSession::Piece& p : pieces) lengths.push_back(int64_t(p.tokens.size()));
    const std::vector<int64_t> starts = prompt_row_starts(lengths);
    start_pieces(pieces);  // (mapped already where prepare_pieces ran: nothing more to do then)
    std::vector<PromptSegment> segments;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const int64_t sequence = pieces[i].sequence, position = places[size_t(sequence)].position;
      embed_prompt_rows(pieces[i].tokens, starts[i]);
      pinned_positions[i] = position;
      segments.push_back({&sequence_states(sequence), lengths[i], starts[i], device_positions + i, position});
    }
    check_cuda(cudaMemcpyAsync(device_positions, pinned_positions, pieces.size() * sizeof(int64_t),
                               cudaMemcpyHostToDevice, stream),
               "positions to the device");
    prompt->run(segments);
    outputs.assign(pieces.size(), {});
    for (size_t i = 0; i < pieces.size(); ++i) {
      CudaSession::PieceOutput& out = outputs[i];
      if (hands_on()) continue;
      if (pieces[i].hidden) {
        out.hidden.resize(size_t(lengths[i] * config.hidden));
        prompt_hidden(starts[i], lengths[i], out.hidden.data());
      }
      if (pieces[i].logits) {
        out.logits.resize(size_t(config.vocab));
        prompt_logits(starts[i] + lengths[i] - 1, out.logits.data());
      }
    }
    check_cuda(cudaStreamSynchronize(stream), "prompt pieces");
    for (size_t i = 0; i < pieces.size(); ++i) places[size_t(pieces[i].sequence)].position += lengths[i];
  }

  // A prompt's embeddings into the pass's rows from `row` on (none where the rows are handed in).
  void embed_prompt_rows(std::span<const int32_t> tokens, int64_t row) {
    if (options.hand_in) return;
    const int64_t n = int64_t(tokens.size()), hidden = config.hidden;
    float* staged = pinned_rows + row * hidden;
    for (int64_t t = 0; t < n; ++t) model::dequantize_row(host.token_embd, tokens[size_t(t)], staged + t * hidden);
    check_cuda(cudaMemcpyAsync(prompt->input_rows() + row * hidden, staged, size_t(n * hidden) * sizeof(float),
                               cudaMemcpyHostToDevice, stream),
               "embeddings to the device");
  }
  // Rows [row, row + n) of the pass's final-normed hidden states to the host (nothing where they
  // are handed on); the copy is queued.
  void prompt_hidden(int64_t row, int64_t n, float* out) {
    if (hands_on()) return;
    check_cuda(cudaMemcpyAsync(out, prompt->output_rows() + row * config.hidden, size_t(n * config.hidden) * sizeof(float),
                               cudaMemcpyDeviceToHost, stream),
               "hidden states to the host");
  }
  // The lm head of the pass's row `row` into out [vocab] (nothing where the rows are handed on).
  void prompt_logits(int64_t row, float* out) {
    if (hands_on()) return;
    mv("lm head", output, prompt->output_rows() + row * config.hidden, logits);
    check_cuda(cudaMemcpyAsync(pinned_logits, logits, size_t(config.vocab) * sizeof(float), cudaMemcpyDeviceToHost, stream),
               "logits to the host");
    check_cuda(cudaStreamSynchronize(stream), "a prompt chunk");
    std::copy_n(pinned_logits, config.vocab, out);
  }

  // The prompt pass for the plan's chunk (options.prompt_chunk, or less where the budget is tight).
  void create_prompt_pass() {
    prompt = std::make_unique<PromptPass>(
        host, layers, *tier, output_norm, vram,
        PromptPassOptions{plan.prompt_chunk, options.max_context, options.prompt_math, options.profile, options.hand_in},
        stream);
    check_cuda(cudaMallocHost(&pinned_rows, size_t(prompt->chunk() * config.hidden) * sizeof(float)), "pinned memory");
  }

  void create_stream_and_pinned() {
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating a stream");
    check_cuda(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking), "creating a stream");
    check_cuda(cudaStreamCreateWithFlags(&hint_stream, cudaStreamNonBlocking), "creating a stream");
    check_cuda(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), "creating an event");
    check_cuda(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), "creating an event");
    check_cuda(cudaEventCreateWithFlags(&hint_fork, cudaEventDisableTiming), "creating an event");
    check_cuda(cudaEventCreateWithFlags(&hint_join, cudaEventDisableTiming), "creating an event");
    const size_t rows = size_t(options.step_rows);
    // A step's inputs as plan::DecodeScratch lays them out: sequences, positions, embeddings.
    const plan::DecodeScratch& l = scratch_layout;
    void* inputs = nullptr;
    check_cuda(cudaMallocHost(&inputs, l.h - l.sequences + rows * size_t(config.hidden) * sizeof(float)), "pinned memory");
    pinned_sequences = static_cast<int32_t*>(inputs);
    pinned_positions = reinterpret_cast<int64_t*>(static_cast<uint8_t*>(inputs) + (l.positions - l.sequences));
    pinned_embedding = reinterpret_cast<float*>(static_cast<uint8_t*>(inputs) + (l.h - l.sequences));
    check_cuda(cudaMallocHost(&pinned_hidden, rows * size_t(config.hidden) * sizeof(float)), "pinned memory");
    // (Also where a step's top candidates land: 64 pairs a row, more than a small vocabulary's floats.)
    const size_t row_floats = std::max<size_t>(size_t(config.vocab), 2 * sample::kTopCandidates);
    check_cuda(cudaMallocHost(&pinned_logits, rows * row_floats * sizeof(float)), "pinned memory");
    if (options.mtp) mtp_stage_for(1);
    // (With the block, a verify step's armed drafts after its greedy tokens, then the draft it
    // continued to: queue_armed.)
    check_cuda(cudaMallocHost(&pinned_token, (options.mtp ? 2 * rows + 1 : rows) * sizeof(int32_t)), "pinned memory");
    check_cuda(cudaMallocHost(&pinned_aside, rows * (1 + sample::kTopAsideMost) * sizeof(int32_t)), "pinned memory");
    check_cuda(cudaMallocHost(&pinned_aside_logits, rows * sample::kTopAsideMost * sizeof(float)), "pinned memory");
    if (plan.prompt_chunk > 0) create_prompt_pass();
  }

  // The step's captured graphs, recaptured at the next step.
  void drop_graphs() {
    const auto drop = [](cudaGraphExec_t& exec) {
      if (exec) cudaGraphExecDestroy(exec);
      exec = nullptr;
    };
    for (auto& [key, exec] : graphs) drop(exec);
    for (auto& [at, exec] : cuts) drop(exec);
    if (!mtp) return;
    for (cudaGraphExec_t& exec : mtp->append) drop(exec);
    for (cudaGraphExec_t& exec : mtp->draft_rows) drop(exec);
  }

  ~Impl() {
    drop_graphs();
    cudaFreeHost(pinned_sequences);  // (with the positions and embeddings after it)
    cudaFreeHost(pinned_hidden);
    cudaFreeHost(pinned_logits);
    free_mtp_stage();
    cudaFreeHost(pinned_token);
    cudaFreeHost(pinned_aside);
    cudaFreeHost(pinned_aside_logits);
    cudaFreeHost(pinned_rows);
    prompt.reset();
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
    if (hint_fork) cudaEventDestroy(hint_fork);
    if (hint_join) cudaEventDestroy(hint_join);
    if (side_stream) cudaStreamDestroy(side_stream);
    if (hint_stream) cudaStreamDestroy(hint_stream);
    if (stream) cudaStreamDestroy(stream);
  }

  cudaStream_t stream = nullptr;
  cudaStream_t side_stream = nullptr;  // the shared expert's branch of a step
  cudaStream_t hint_stream = nullptr;  // the miss hint's branch
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaEvent_t hint_fork = nullptr, hint_join = nullptr;  // the miss hint's branch
  bool hint_pending = false;                              // forked, not yet joined (while capturing)
  // (sequence, keeps states, rows, StepOutput): made on first use. A step of one sequence's tokens
  // (one, or a verify window) reads that sequence's state as kernel arguments, as a session of one
  // sequence does (a graph per sequence); a step of rows of several sequences (sequence -1) looks
  // each row's up on the device.
  std::map<std::tuple<int64_t, bool, int, int>, cudaGraphExec_t> graphs;
  // The states the step being queued reads: `states` (rows of several sequences), or the current
  // sequence's own.
  const std::vector<LayerState>* stepping = nullptr;
  // A step's inputs in one pinned allocation, laid out as in the scratch: [step_rows] sequences,
  // [step_rows] positions, [step_rows][hidden] embeddings.
  int32_t* pinned_sequences = nullptr;
  int64_t* pinned_positions = nullptr;
  float* pinned_embedding = nullptr;
  float* pinned_hidden = nullptr;     // likewise, the final-normed states back
  float* pinned_logits = nullptr;
  int32_t* pinned_token = nullptr;
  int32_t* pinned_aside = nullptr;         // a step's ids set aside, as top_aside holds them
  float* pinned_aside_logits = nullptr;    // and their logits back
  int64_t* device_positions = nullptr;  // [step_rows] (a prompt chunk's: its first position)
  int32_t* device_sequences = nullptr;  // [step_rows]
  float* pinned_rows = nullptr;         // a prompt chunk's embeddings
  std::unique_ptr<PromptPass> prompt;  // null: prompts run token by token
  void* miss_words = nullptr;          // the CPU miss path's device words, in the decode scratch
  std::unique_ptr<MissPath> miss;      // null: decode misses are read over PCIe
  std::vector<kernels::MissStage> stages;  // per layer, with `miss`
  std::string miss_summary;
};

namespace {
// The options, once the GPU's attention and their K/V format can hold the model's heads: refused
// before any weight is uploaded.
const CudaSessionOptions& with_heads_checked(const CudaSessionOptions& options, const model::Qwen35MoeConfig& config) {
  if (config.head_dim > 256 || config.head_dim % 8 != 0)
    fail("cuda session: attention heads of {} values; the GPU's attention takes a multiple of 8, at most 256 "
         "(--backend cpu runs any)", config.head_dim);
  kv::check_head_dim(options.kv_format, config.head_dim);
  if (config.n_layers > config.n_full_attention_layers())
    if (const char* why = kernels::deltanet_step_refuses(int(config.ssm_state), int(config.ssm_state)))
      fail("cuda session: DeltaNet heads of {} values: {} (--backend cpu runs any)", config.ssm_state, why);
  return options;
}
}  // namespace

plan::PlanOptions plan_options(const CudaSessionOptions& options, size_t budget) {
  return {.budget = budget,
          .kv = options.kv_format,
          .context = options.max_context,
          .parallel = options.sequences,
          .kv_positions = options.kv_positions,
          .step_rows = options.step_rows,
          .window_rows = options.window_rows,
          .mtp = options.mtp,
          .head = options.next_norm.empty(),
          .prompt_chunk = options.prompt_chunk > 1 ? options.prompt_chunk : 0,
          .max_resident_experts = options.max_resident_experts};
}

CudaSession::CudaSession(const gguf::Reader& reader, const model::Qwen35MoeConfig& config, CudaSessionOptions options)
    : CudaSession(reader, std::make_shared<const model::ModelWeights>(model::bind_weights(reader, config)), options) {}

CudaSession::CudaSession(const gguf::Reader& reader, std::shared_ptr<const model::ModelWeights> weights,
                         CudaSessionOptions options)
    : impl_(std::make_unique<Impl>(reader, weights, with_heads_checked(options, weights->config))) {
  const model::Qwen35MoeConfig& config = weights->config;
  if (options.max_context <= 0) fail("cuda session: max_context must be positive");
  if (options.step_rows < 1 || options.step_rows > kMaxStepRows)
    fail("cuda session: step_rows {} is outside 1..{}", options.step_rows, kMaxStepRows);
  if (options.mtp && !weights->mtp) fail("--mtp: {}", weights->mtp_unavailable);
  if (options.window_rows < 0 || options.window_rows > options.step_rows)
    fail("cuda session: window_rows {} is outside 0..step_rows ({})", options.window_rows, options.step_rows);
  if (options.sequences < 1 || options.sequences > options.step_rows)
    fail("cuda session: {} sequences; it takes 1 to step_rows ({}), the most rows one step runs", options.sequences,
         options.step_rows);
  if (options.mtp && !options.next_norm.empty())
    fail("cuda session: the MTP block goes with the lm head, on the share of the layers that holds the last one");
  if (!options.next_norm.empty() && int64_t(options.next_norm.size()) != config.hidden)
    fail("cuda session: the next share's norm has {} values; the model's hidden size is {}", options.next_norm.size(),
         config.hidden);
  if (options.kv_positions < 0 || options.kv_positions > options.sequences * options.max_context)
    fail("cuda session: {} positions of K/V shared by {} sequences of {} (at most {}; 0: all of them)",
         options.kv_positions, options.sequences, options.max_context, options.sequences * options.max_context);
  Impl& s = *impl_;
  // The plan first: nothing is uploaded for a budget it refuses.
  s.plan = plan::plan_memory(s.host, plan_options(options, s.vram.budget()));
  s.tier = std::make_unique<ExpertTier>(s.host, s.plan, s.vram);
  s.allocate_scratch();
  for (int64_t layer = 0; layer < config.n_layers; ++layer) s.bind_layer(layer);
  if (s.hands_on()) {
    s.output_norm = s.upload(options.next_norm, "the next share's attn_norm");
  } else {
    s.output_norm = s.upload(s.host.output_norm, "output_norm");
    s.output = s.matrix(s.host.output);
  }
  if (options.mtp) s.bind_mtp(s.scratch_layout, s.scratch_base);
  s.tier->load(options.expert_scores);  // after the trunk's uploads (see ExpertTier::load)
  s.tier->enable_swaps(options.swaps, s.route_counts);
  s.allocate_sequences();
  s.create_stream_and_pinned();
  s.create_miss_path();
  for (s.current = 0; s.current < options.sequences; ++s.current) s.zero_states();
  s.current = 0;
  synchronize();
}

CudaSession::~CudaSession() = default;

std::vector<float> CudaSession::prefill(std::span<const int32_t> tokens, bool all_logits, std::vector<float>* hidden) {
  if (tokens.empty()) fail("cuda session: prefill needs at least one token");
  const int64_t vocab = impl_->config.vocab, width = impl_->config.hidden;
  std::vector<float> logits(size_t((all_logits ? int64_t(tokens.size()) : 1) * vocab));
  if (impl_->hands_on()) {  // (no lm head here: the rows go on, nothing comes out)
    if (tokens.size() > 1 && impl_->prompt) impl_->prefill_chunks(tokens, false, nullptr);
    else
      for (int32_t token : tokens) impl_->step(token, Impl::StepOutput::none);
    if (hidden) hidden->clear();
    return {};
  }
  if (hidden) hidden->resize(tokens.size() * size_t(width));
  if (tokens.size() > 1 && impl_->prompt) {
    impl_->prefill_chunks(tokens, all_logits, logits.data(), hidden ? hidden->data() : nullptr);
    return logits;
  }
  std::vector<float> scratch(hidden ? size_t(vocab) : 0);  // logits of positions whose logits are not wanted
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool last = i + 1 == tokens.size();
    float* out = all_logits ? logits.data() + i * size_t(vocab) : (last ? logits.data() : nullptr);
    if (hidden) {  // (the hidden state is the lm head's input: a step with logits)
      int32_t greedy = -1;
      impl_->step(tokens.subspan(i, 1), {}, Impl::StepOutput::logits, out ? out : scratch.data(), &greedy,
                  hidden->data() + i * size_t(width));
      continue;
    }
    impl_->step(tokens[i], out ? Impl::StepOutput::logits : Impl::StepOutput::none, out);
  }
  return logits;
}

std::vector<float> CudaSession::decode(int32_t token) { return prefill(std::span<const int32_t>(&token, 1)); }

int32_t CudaSession::decode_greedy(int32_t token) {
  const int32_t next = impl_->step(token, Impl::StepOutput::greedy_token);
  // (A step with launches left out computes nothing meaningful; a share that hands its rows on
  // chooses no token.)
  if (next < 0 && impl_->left_out.empty() && !impl_->hands_on())
    fail("cuda session: the step's logits hold NaN or +inf, or are all -inf, so there is no greedy token (a damaged "
         "model file?)");
  return next;
}

namespace {

void check_mtp_sequence(const CudaSession& session, int64_t sequence) {
  if (!session.has_mtp()) fail("cuda session: made without the MTP block (options.mtp)");
  if (sequence < 0 || sequence >= session.sequences())
    fail("cuda session: no sequence {} to draft for (it holds {})", sequence, session.sequences());
}

// Drafts to arm in a verify step of n tokens (CudaSession::WindowDrafts), checked before it runs.
void check_armed(const CudaSession& s, const CudaSession::WindowDrafts& d, int64_t n, bool greedy_only) {
  check_mtp_sequence(s, d.sequence);
  if (!s.arms_drafts()) fail("cuda session: drafts cannot be armed here (an embedding table the GPU cannot expand)");
  if (!greedy_only) fail("cuda session: drafts are armed in greedy verify steps only");
  const int64_t end = d.first_row + n + (d.continues ? 1 : 0);
  if (d.first_row < 0 || end > s.max_context())
    fail("cuda session: MTP rows {}..{} past the context of {}", d.first_row, end, s.max_context());
  if (d.continues && n > kernels::kMaxWindowTokens)
    fail("cuda session: a verify step continues drafts after windows of at most {} tokens, not {}",
         kernels::kMaxWindowTokens, n);
}

}  // namespace

CudaSession::Window CudaSession::decode_window(std::span<const int32_t> tokens, bool greedy_only, bool want_hidden,
                                               const WindowDrafts* drafts) {
  Impl& s = *impl_;
  const size_t n = tokens.size();
  if (s.hands_on()) return s.step(tokens, {}, Impl::StepOutput::none, nullptr, nullptr, nullptr), Window{};
  if (drafts) check_armed(*this, *drafts, int64_t(n), greedy_only);
  Window out;
  if (greedy_only) out.greedy.resize(n);
  else out.logits.resize(n * size_t(s.config.vocab));
  if (want_hidden) out.hidden.resize(n * size_t(s.config.hidden));
  if (drafts) out.drafts.resize(n);
  struct Arm {  // (for this step only, whatever it throws)
    Impl& s;
    ~Arm() { s.arming = {}; }
  } arm{s};
  s.arming = {drafts, tokens, out.drafts.data(), &out.continued};
  s.step(tokens, {}, greedy_only ? Impl::StepOutput::greedy_token : Impl::StepOutput::logits, out.logits.data(),
         out.greedy.data(), want_hidden ? out.hidden.data() : nullptr);
  s.check_greedy(out.greedy);
  return out;
}

CudaSession::Window CudaSession::decode_rows(std::span<const Row> rows, bool greedy_only, bool want_hidden,
                                             bool top) {
  Impl& s = *impl_;
  const size_t n = rows.size();
  if (n == 0) fail("cuda session: a step of no rows");
  std::vector<int32_t> tokens(n);
  std::vector<int64_t> sequences(n);
  std::vector<std::span<const int32_t>> aside(n);
  for (size_t r = 0; r < n; ++r) tokens[r] = rows[r].token, sequences[r] = rows[r].sequence, aside[r] = rows[r].aside;
  if (s.hands_on()) return s.step(tokens, sequences, Impl::StepOutput::none, nullptr, nullptr, nullptr), Window{};
  top = top && !greedy_only;
  for (const std::span<const int32_t> ids : aside) {
    if (!ids.empty() && !top) fail("cuda session: ids set aside belong to a step of top candidates");
    if (ids.size() > size_t(sample::kTopAsideMost))
      fail("cuda session: {} ids set aside in a row; it takes at most {}", ids.size(), sample::kTopAsideMost);
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= s.config.vocab || (i > 0 && ids[i] <= ids[i - 1]))
        fail("cuda session: ids set aside must ascend inside the vocabulary [0, {})", s.config.vocab);
  }
  Window out;
  if (greedy_only) out.greedy.resize(n);
  else if (top) out.top.resize(n * sample::kTopCandidates), out.finite.resize(n);
  else out.logits.resize(n * size_t(s.config.vocab));
  if (want_hidden) out.hidden.resize(n * size_t(s.config.hidden));
  const auto wanted = greedy_only ? Impl::StepOutput::greedy_token
                      : top       ? Impl::StepOutput::top_candidates
                                  : Impl::StepOutput::logits;
  s.step(tokens, sequences, wanted, out.logits.data(), out.greedy.data(), want_hidden ? out.hidden.data() : nullptr,
         out.top.data(), out.finite.data(), aside, top ? &out.aside : nullptr);
  s.check_greedy(out.greedy);
  return out;
}

std::vector<float> CudaSession::prefill_chunk(std::span<const int32_t> tokens, bool all_logits, bool last_logits,
                                             std::vector<float>* hidden) {
  Impl& s = *impl_;
  if (!s.prompt) fail("cuda session: prompts run token by token here (no prompt pass)");
  if (tokens.empty() || int64_t(tokens.size()) > s.prompt->chunk())
    fail("cuda session: a prompt chunk of {} tokens; this session's chunks take 1 to {}", tokens.size(), s.prompt->chunk());
  s.start_prompt(tokens);  // (mapped already where prepare_prompt ran: nothing more to do then)
  const bool out = !s.hands_on();
  std::vector<float> logits(out && (all_logits || last_logits) ? (all_logits ? tokens.size() : 1) * size_t(s.config.vocab) : 0);
  if (hidden) hidden->resize(out ? tokens.size() * size_t(s.config.hidden) : 0);
  s.prompt_chunk(tokens, all_logits, last_logits, logits.data(), hidden && out ? hidden->data() : nullptr);
  return logits;
}

void CudaSession::prepare_prompt(std::span<const int32_t> tokens) { impl_->start_prompt(tokens); }

void CudaSession::prepare_pieces(std::span<const Piece> pieces) { impl_->start_pieces(pieces); }

bool CudaSession::pieces_fit(std::span<const int64_t> lengths) const {
  const Impl& s = *impl_;
  return s.prompt && !lengths.empty() && int64_t(lengths.size()) <= s.options.step_rows &&
         std::all_of(lengths.begin(), lengths.end(), [](int64_t n) { return n > 0; }) &&
         prompt_row_starts(lengths).back() <= s.prompt->chunk();
}

std::vector<CudaSession::PieceOutput> CudaSession::prefill_pieces(std::span<const Piece> pieces) {
  Impl& s = *impl_;
  if (!s.prompt) fail("cuda session: prompts run token by token here (no prompt pass)");
  std::vector<int64_t> lengths;
  std::vector<bool> seen(size_t(s.options.sequences), false);
  for (const Piece& p : pieces) {
    if (p.sequence < 0 || p.sequence >= s.options.sequences)
      fail("cuda session: sequence {}; this session holds {} (options.sequences)", p.sequence, s.options.sequences);
    if (seen[size_t(p.sequence)]) fail("cuda session: sequence {} has two prompt pieces in one pass", p.sequence);
    seen[size_t(p.sequence)] = true;
    lengths.push_back(int64_t(p.tokens.size()));
  }
  if (!pieces_fit(lengths))
    fail("cuda session: {} prompt pieces do not fit one pass: at most {} pieces of at least one token, spanning at "
         "most {} rows with each piece starting on a multiple of {}",
         pieces.size(), s.options.step_rows, s.prompt->chunk(), kPromptRowAlign);
  std::vector<PieceOutput> outputs;
  s.prompt_pieces(pieces, outputs);
  return outputs;
}

CudaSession::HandOver CudaSession::hand_over(bool prompt) const {
  const Impl& s = *impl_;
  if (prompt && !s.prompt) fail("cuda session: prompts run token by token here (no prompt pass)");
  return prompt ? HandOver{s.prompt->input_rows(), s.prompt->normed_rows()} : HandOver{s.h, s.normed};
}

CudaSession::HandOver CudaSession::receiving(int64_t rows, bool prompt) const {
  const Impl& s = *impl_;
  if (!s.options.hand_in) fail("cuda session: rows handed in to a session that reads its embeddings");
  if (prompt && !s.prompt) fail("cuda session: prompts run token by token here (no prompt pass)");
  if (rows < 1 || rows > (prompt ? s.prompt->chunk() : s.options.step_rows))
    fail("cuda session: {} rows handed in; a {} here takes 1 to {}", rows, prompt ? "prompt chunk" : "step",
         prompt ? s.prompt->chunk() : s.options.step_rows);
  return hand_over(prompt);
}

void CudaSession::receive(const HandOver& from, int from_device, int64_t rows, bool prompt) {
  Impl& s = *impl_;
  // (The copies wait for nothing on the GPU before: the share before ended its call waiting for its
  // stream, and nothing it queues later writes these rows before its next call.)
  const HandOver to = receiving(rows, prompt);
  const size_t bytes = size_t(rows * s.config.hidden) * sizeof(float);
  check_cuda(cudaMemcpyPeerAsync(to.h, s.options.device, from.h, from_device, bytes, s.stream), "rows from the GPU before");
  check_cuda(cudaMemcpyPeerAsync(to.normed, s.options.device, from.normed, from_device, bytes, s.stream),
             "rows from the GPU before");
}

bool CudaSession::hands_on() const { return impl_->hands_on(); }

void CudaSession::lend_experts(std::span<const LentExpert> lent) {
  std::vector<ExpertTier::Lent> in;
  for (const LentExpert& e : lent) in.push_back({e.layer, e.expert, e.projections});
  impl_->tier->lend_in(in);
}
void* CudaSession::stream() const { return impl_->stream; }

void CudaSession::use_sequence(int64_t sequence) {
  Impl& s = *impl_;
  if (sequence < 0 || sequence >= s.options.sequences)
    fail("cuda session: sequence {}; this session holds {} (options.sequences)", sequence, s.options.sequences);
  s.current = sequence;
}

int64_t CudaSession::sequence() const { return impl_->current; }
int64_t CudaSession::sequences() const { return impl_->options.sequences; }

void CudaSession::cut_window(int64_t tokens) {
  Impl& s = *impl_;
  Impl::Place& at = s.place();
  if (at.window_start < 0)
    fail("cuda session: no verify window to cut (the sequence's last step was not a window of several tokens)");
  if (tokens < 1 || tokens > at.window_tokens)
    fail("cuda session: cannot keep {} tokens of a window of {} (a cut keeps 1 to {})", tokens, at.window_tokens,
         at.window_tokens);
  if (tokens == at.window_tokens) return;
  // Queued on the step's stream, which the next step follows (no wait here). The kept states are
  // this sequence's: a window of another one since would have ended its window (Impl::step), and
  // steps that are not windows keep none.
  const int64_t row = at.window_row + tokens;  // the row whose kept states it goes back to
  s.replay(s.cuts[{s.current, row}], "cutting a window", [&] { s.queue_cut(row); });
  // The K/V rows past the kept tokens stay where they are: attention reads up to the position, and
  // the next steps write over them.
  at.position = at.window_start + tokens;
  at.window_tokens = tokens;
}

bool CudaSession::has_mtp() const { return impl_->mtp != nullptr; }

bool CudaSession::arms_drafts() const { return has_mtp() && impl_->mtp->embedding.data != nullptr; }

int64_t CudaSession::armed_windows() const { return has_mtp() ? impl_->mtp->armed_windows : 0; }

void CudaSession::mtp_continue_from_armed(int64_t row) {
  Impl& s = *impl_;
  if (armed_windows() == 0) fail("cuda session: no verify step has armed drafts to continue from");
  if (row < 0 || row > s.options.step_rows)  // (row n of a window of n: a continued draft's output)
    fail("cuda session: no armed row {} (step_rows {})", row, s.options.step_rows);
  const size_t row_bytes = size_t(s.config.hidden) * sizeof(float);
  check_cuda(cudaMemcpyAsync(s.normed, s.mtp->armed + row * s.config.hidden, row_bytes, cudaMemcpyDeviceToDevice, s.stream),
             "continuing from an armed draft");
}

void CudaSession::mtp_append(int64_t sequence, std::span<const int32_t> tokens, std::span<const float> hidden,
                             int64_t row, int64_t shift) {
  Impl& s = *impl_;
  const int64_t n = int64_t(tokens.size()), width = s.config.hidden;
  check_mtp_sequence(*this, sequence);
  if (int64_t(hidden.size()) != n * width) fail("cuda session: {} hidden values for {} MTP rows", hidden.size(), n);
  if (row < 0 || row + n > s.options.max_context)
    fail("cuda session: MTP rows {}..{} past the context of {}", row, row + n, s.options.max_context);
  // In pieces the step's scratch holds, all staged before the stream copies any; each piece's rows
  // through every sequence's cache (rows_state), so that a graph serves all sequences.
  const int64_t most = s.options.step_rows;
  s.mtp_stage_for((n + most - 1) / most);
  const std::vector<int64_t> of(size_t(most), sequence), shifts(size_t(most), shift);
  std::vector<int64_t> rows_of(of.size());
  for (int64_t at = 0, p = 0; at < n; at += most, ++p) {
    const int64_t piece = std::min(most, n - at);
    std::iota(rows_of.begin(), rows_of.end(), row + at);
    s.mtp_row_inputs(std::span(of).first(size_t(piece)), tokens.subspan(size_t(at), size_t(piece)),
                     hidden.data() + at * width, std::span(rows_of).first(size_t(piece)),
                     std::span(shifts).first(size_t(piece)), p);
    const Impl::WindowRows rows(s, piece);  // (the MTP block's layer has no DeltaNet states)
    s.replay(s.mtp->append[size_t(piece - 1)], "the MTP block's rows", [&] { s.mtp_rows_kv(); });
  }
  check_cuda(cudaStreamSynchronize(s.stream), "the MTP block's rows");
}

void CudaSession::mtp_draft_rows(std::span<const int64_t> sequences, std::span<const int32_t> tokens,
                                 std::span<const float> hidden, std::span<const int64_t> rows,
                                 std::span<const int64_t> shifts, std::span<int32_t> out,
                                 std::span<float> probabilities) {
  Impl& s = *impl_;
  const model::Qwen35MoeConfig& c = s.config;
  const int64_t n = int64_t(tokens.size());
  if (n < 1 || n > s.options.step_rows)
    fail("cuda session: a draft step of {} rows; this session takes 1 to {} (step_rows)", n, s.options.step_rows);
  if (sequences.size() != tokens.size() || rows.size() != tokens.size() || shifts.size() != tokens.size() ||
      out.size() != tokens.size() || (!probabilities.empty() && probabilities.size() != tokens.size()))
    fail("cuda session: a draft step's sequences, tokens, rows, shifts and outputs differ in number");
  if (!hidden.empty() && int64_t(hidden.size()) != n * c.hidden)
    fail("cuda session: {} hidden values for {} MTP rows", hidden.size(), n);
  std::vector<int64_t> seen(sequences.begin(), sequences.end());
  std::ranges::sort(seen);
  if (std::ranges::adjacent_find(seen) != seen.end()) fail("cuda session: a draft step holds a sequence twice");
  for (int64_t t = 0; t < n; ++t) {
    check_mtp_sequence(*this, sequences[size_t(t)]);
    if (tokens[size_t(t)] < 0 || tokens[size_t(t)] >= c.vocab)
      fail("cuda session: token id {} is outside the vocabulary [0, {})", tokens[size_t(t)], c.vocab);
    if (rows[size_t(t)] < 0 || rows[size_t(t)] >= s.options.max_context)
      fail("cuda session: MTP row {} past the context of {}", rows[size_t(t)], s.options.max_context);
  }
  s.mtp_row_inputs(sequences, tokens, hidden.empty() ? nullptr : hidden.data(), rows, shifts);
  {
    const Impl::WindowRows window(s, n);
    s.replay(s.mtp->draft_rows[size_t(n - 1)], "a draft step of several sequences",
             [&] { s.mtp_draft_step(); });
  }
  check_cuda(cudaMemcpyAsync(s.pinned_token, s.device_token, size_t(n) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                             s.stream),
             "the drafts to the host");
  if (!probabilities.empty())
    check_cuda(cudaMemcpyAsync(s.pinned_logits, s.logits, size_t(n * c.vocab) * sizeof(float), cudaMemcpyDeviceToHost,
                               s.stream),
               "the drafts' logits to the host");
  check_cuda(cudaStreamSynchronize(s.stream), "a draft step of several sequences");
  for (int64_t t = 0; t < n; ++t) {
    const int32_t best = s.pinned_token[t];
    if (best < 0) fail("cuda session: the MTP block's logits hold NaN or +inf, or are all -inf (a damaged model file?)");
    out[size_t(t)] = best;
    if (!probabilities.empty())
      probabilities[size_t(t)] = float(
          sample::probability_of(std::span(s.pinned_logits + t * c.vocab, size_t(c.vocab)), best));
  }
}

void CudaSession::ready_steps(const StepsAhead& ahead) {
  impl_->ready_steps(ahead);
  synchronize();  // (the uploads)
}

int64_t CudaSession::graphs_captured() const { return impl_->graphs_captured; }

void CudaSession::reset() {
  impl_->zero_states();
  impl_->kv->trim(impl_->current, 0);
  synchronize();
}

bool CudaSession::reserve_kv(int64_t positions) { return impl_->kv->reserve(impl_->current, positions); }

void CudaSession::fill_with_random_cells(int64_t depth) {
  Impl& s = *impl_;
  if (depth < 0 || depth >= s.options.max_context)
    fail("cuda session: a depth of {} does not fit the context of {} positions", depth, s.options.max_context);
  reset();
  // One block of random rows, written again and again: what the cells hold does not matter here.
  // They sit in the prompt pass's input rows (free between prompts), else in scratch of their own.
  const model::Qwen35MoeConfig& c = s.config;
  const int64_t row = c.kv_dim();
  const int64_t room = s.prompt ? s.prompt->chunk() * c.hidden / (2 * row) : 4096;
  const int64_t block = std::min<int64_t>({std::max<int64_t>(depth, 1), 4096, std::max<int64_t>(room, 1)});
  std::vector<float> rows(size_t(2 * block * row));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : rows) x = normal(rng);
  DeviceBuffer own;
  if (!s.prompt) own = DeviceBuffer(s.vram, rows.size() * sizeof(float), VramUse::scratch, "random K/V rows");
  float* k = s.prompt ? s.prompt->input_rows() : own.as<float>();
  copy_to_device(k, rows.data(), rows.size() * sizeof(float));
  s.prepare_kv(s.current, 0, depth);
  for (int layer = 0; layer < s.kv->n_layers(); ++layer)
    for (int64_t first = 0; first < depth; first += block)
      check(kernels::kv_write(s.kv->layer(layer, s.current), k, k + block * row, first, int(std::min(block, depth - first)),
                              int(c.n_kv_heads), int(c.head_dim), s.stream),
            "writing random K/V cells");
  synchronize();
  s.place().position = depth;
}

CudaSession::Snapshot CudaSession::save() const {
  const Impl& s = *impl_;
  check_cuda(cudaStreamSynchronize(s.stream), "the step's stream");  // a cut window's copies first
  const int64_t positions = s.place().position;
  return {.format = s.options.kv_format,
          .positions = positions,
          .cells = s.kv->save(positions, s.current),
          .states = s.states_to_host()};
}

void CudaSession::restore(const Snapshot& snapshot) {
  Impl& s = *impl_;
  check_cuda(cudaStreamSynchronize(s.stream), "the step's stream");  // a cut window's copies first
  if (snapshot.format != s.options.kv_format)
    fail("cuda session: a snapshot of {} K/V cells cannot continue in a {} cache", kv::to_string(snapshot.format),
         kv::to_string(s.options.kv_format));
  if (snapshot.positions > s.options.max_context)
    fail("cuda session: a snapshot of {} positions does not fit the context of {}; raise max_context",
         snapshot.positions, s.options.max_context);
  s.check_states(snapshot.states.size());
  s.move_in([&] {
    s.kv->restore(snapshot.cells, snapshot.positions, s.current);
    s.states_from_host(snapshot.states.data(), snapshot.states.size());
    s.place() = {.position = snapshot.positions};
    synchronize();  // (the copies above may still be in flight: the snapshot may go once this returns)
  });
}

int64_t CudaSession::Prefix::positions() const { return cells->positions(); }
int64_t CudaSession::Prefix::host_bytes() const {
  return cells->host_bytes() + int64_t(states.size() * sizeof(float));
}

std::shared_ptr<const CudaSession::Prefix> CudaSession::keep() {
  Impl& s = *impl_;
  check_cuda(cudaStreamSynchronize(s.stream), "the step's stream");  // a cut window's copies first
  auto prefix = std::make_shared<Prefix>();
  prefix->cells = s.kv->keep(s.current, s.place().position);
  if (!s.prefix_states) s.prefix_states = std::make_shared<PinnedBlocks>(s.state_floats() * sizeof(float));
  prefix->states = HostFloats(s.prefix_states, s.state_floats());
  s.states_to_host(prefix->states.data());
  prefix->session = this;
  return prefix;
}

void CudaSession::resume(const Prefix& prefix) {
  Impl& s = *impl_;
  if (prefix.session != this) fail("cuda session: the prefix was kept by another session");
  check_cuda(cudaStreamSynchronize(s.stream), "the step's stream");  // a cut window's copies first
  s.move_in([&] {
    s.kv->resume(*prefix.cells, s.current);
    s.states_from_host(prefix.states.data(), prefix.states.size());
    s.place() = {.position = prefix.positions()};
    synchronize();
  });
}

CudaSession::StepBytes CudaSession::decode_bytes(int64_t depth) const {
  const model::Qwen35MoeConfig& c = impl_->config;
  const auto bytes = [](const auto& m) { return m.rows * int64_t(m.row_bytes); };
  StepBytes s;
  for (const DeviceLayer& d : impl_->layers) {
    if (d.recurrent) {
      s.weights += bytes(d.qkv) + bytes(d.z) + bytes(d.b) + bytes(d.alpha) + bytes(d.out);
      s.state += 2 * c.ssm_dt_rank * c.ssm_state * c.ssm_state * 4;
    } else {
      s.weights += bytes(d.q) + bytes(d.k) + bytes(d.v) + bytes(d.o);
      s.state += (depth + 1) * kv::cell_bytes(impl_->options.kv_format, c.n_kv_heads, c.head_dim);
    }
    s.weights += bytes(d.router) + bytes(d.shared_gate) + bytes(d.shared_up) + bytes(d.shared_down);
    s.weights += c.n_experts_used * (bytes(d.gate) + bytes(d.up) + bytes(d.down));
  }
  s.weights += bytes(impl_->output) + (impl_->options.hand_in ? 0 : int64_t(impl_->host.token_embd.row_bytes));
  return s;
}

double CudaSession::prompt_flops(int64_t first, int64_t n) const {
  const model::Qwen35MoeConfig& c = impl_->config;
  const auto values = [](const auto& m) { return double(m.rows) * double(m.cols); };
  double per_token = 0, attention = 0;
  // Positions attended by the n tokens in all: sum over t of (first + t + 1).
  const double positions = double(n) * double(first) + double(n) * double(n + 1) / 2;
  for (const DeviceLayer& d : impl_->layers) {
    if (d.recurrent) {
      per_token += values(d.qkv) + values(d.z) + values(d.b) + values(d.alpha) + values(d.out);
    } else {
      per_token += values(d.q) + values(d.k) + values(d.v) + values(d.o);
      attention += 2.0 * 2.0 * double(c.n_heads) * double(c.head_dim) * positions;
    }
    per_token += values(d.router) + values(d.shared_gate) + values(d.shared_up) + values(d.shared_down);
    per_token += double(c.n_experts_used) * (values(d.gate) + values(d.up) + values(d.down));
  }
  return 2.0 * per_token * double(n) + 2.0 * values(impl_->output) + attention;
}

std::vector<std::pair<std::string, double>> CudaSession::profile() const {
  return impl_->clock.totals();
}

bool CudaSession::can_leave_out(std::string_view launch) {
  return std::find(std::begin(kMissPathLaunches), std::end(kMissPathLaunches), launch) == std::end(kMissPathLaunches);
}

void CudaSession::leave_out(std::vector<std::string> launches) {
  Impl& s = *impl_;
  for (const std::string& l : launches)
    if (!can_leave_out(l)) fail("cuda session: \"{}\" cannot be left out of a step", l);
  s.left_out = std::set<std::string, std::less<>>(launches.begin(), launches.end());
  s.drop_graphs();  // captured with the old set
}

void CudaSession::profile_steps_by(StepProfile how) {
  if (!impl_->options.profile) fail("cuda session: profile_steps_by needs a session made with options.profile");
  impl_->step_profile = how;
}

std::vector<KernelClassTime> CudaSession::kernel_profile() const {
  return impl_->kernel_clock.totals();
}

std::vector<std::pair<std::string, double>> CudaSession::prompt_profile() const {
  return impl_->prompt ? impl_->prompt->profile() : std::vector<std::pair<std::string, double>>{};
}

const plan::MemoryPlan& CudaSession::plan() const { return impl_->plan; }

std::vector<uint64_t> CudaSession::routing_counts() const {
  const Impl& s = *impl_;
  std::vector<unsigned> counts(size_t(s.config.n_layers * s.config.n_experts));
  check_cuda(cudaStreamSynchronize(s.stream), "routing counts");
  copy_to_host(counts.data(), s.route_counts, counts.size() * sizeof(unsigned));
  return {counts.begin(), counts.end()};
}

ExpertStats CudaSession::expert_stats() const {
  const Impl& s = *impl_;
  const int64_t layers = s.config.n_layers;
  std::vector<unsigned> misses(size_t(4 * layers));
  check_cuda(cudaStreamSynchronize(s.stream), "expert counters");
  copy_to_host(misses.data(), s.route_misses, misses.size() * sizeof(unsigned));
  ExpertStats stats{.resident = s.tier->resident_count(), .total = layers * s.config.n_experts,
                    .swaps = s.tier->swaps(), .host_tier = s.tier->host_tier(), .miss_path = {}};
  for (uint64_t c : routing_counts()) stats.routed += c;
  for (int64_t l = 0; l < layers; ++l) {  // (route_misses' four rows)
    const auto at = [&](int64_t row) { return uint64_t(misses[size_t(row * layers + l)]); };
    stats.missed += at(0) + at(1) + at(2);
    stats.decode_miss_bytes += (at(0) + at(3)) * s.tier->expert_bytes(l);
  }
  stats.prompt_miss_bytes = s.prompt ? s.prompt->miss_bytes() : 0;
  stats.miss_path = s.miss_summary;
  if (s.miss) {
    const MissStats m = s.miss->stats();
    stats.cpu_experts = m.experts, stats.cpu_hinted_experts = m.hinted_experts, stats.cpu_expert_bytes = m.expert_bytes,
    stats.cpu_read_ahead_bytes = m.read_ahead_bytes, stats.cpu_seconds = m.cpu_seconds;
    stats.gpu_share_seconds = m.gpu_share_seconds, stats.host_wait_seconds = m.host_wait_seconds;
    // (One-token steps' misses count routings: the CPU's are theirs. Grouped steps' reads are
    // counted less the CPU's already.)
    stats.decode_miss_bytes -= std::min(stats.decode_miss_bytes, m.token_pair_bytes);
  }
  return stats;
}

int64_t CudaSession::prompt_chunk() const { return impl_->prompt ? impl_->prompt->chunk() : 0; }
int64_t CudaSession::step_rows() const { return impl_->options.step_rows; }
int64_t CudaSession::window_rows() const { return impl_->window_rows(); }
int64_t CudaSession::position() const { return impl_->place().position; }
int64_t CudaSession::max_context() const { return impl_->options.max_context; }
int CudaSession::device() const { return impl_->options.device; }
int64_t CudaSession::vocab() const { return impl_->config.vocab; }
const model::Qwen35MoeConfig& CudaSession::config() const { return impl_->config; }
KvFormat CudaSession::kv_format() const { return impl_->options.kv_format; }
int64_t CudaSession::kv_pool_positions() const { return impl_->options.kv_positions; }
int64_t CudaSession::kv_free_pages() const { return impl_->kv->free_pages(); }

int64_t CudaSession::kv_bytes() const {
  const model::Qwen35MoeConfig& c = impl_->config;
  return position() * c.n_full_attention_layers() * kv::cell_bytes(impl_->options.kv_format, c.n_kv_heads, c.head_dim);
}
const VramAccountant& CudaSession::vram() const { return impl_->vram; }
VramAccountant& CudaSession::vram() { return impl_->vram; }

}  // namespace lode::cuda
