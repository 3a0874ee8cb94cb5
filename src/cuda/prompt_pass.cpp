#include "cuda/prompt_pass.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/dequant.h"
#include "cuda/errors.h"
#include "cuda/expert_products.h"
#include "cuda/expert_tier.h"
#include "cuda/forward_kernels.h"
#include "cuda/matvec.h"
#include "cuda/phase_clock.h"
#include "cuda/prompt_kernels.h"
#include "cuda/vram.h"
#include "plan/scratch.h"

namespace lode::cuda {

namespace {

// The grid i-quants have no expansion kernel: their products go through the matrix-vector kernels
// (one launch covers at most this many products).
constexpr int64_t kMaxMatvecProblems = 65535;

static_assert(plan::kPromptExpertTileRows == kExpertTileRows && sizeof(ExpertTile) == 16,
              "plan::prompt_scratch sizes the expert tiles");

enum Phase : size_t { expand, dense, attention_core, deltanet_conv, deltanet_core, routing, experts, elementwise };
const std::vector<std::string> kPhaseNames = {"expanding weights",        "dense products (cuBLAS)",
                                              "attention core",           "DeltaNet conv and L2 norms",
                                              "DeltaNet scan and norm",   "routing (with a host sync)",
                                              "expert products",          "norms, swiglu, sums"};

}  // namespace

struct PromptPass::Impl {
  using Segments = std::span<const PromptSegment>;
  Impl(const model::ModelWeights& w, const std::vector<DeviceLayer>& l, const ExpertTier& t, const float* on,
       VramAccountant& v, PromptPassOptions o, void* s)
      : model_weights(w), config(w.config), layers(l), tier(t), output_norm(on), vram(v), options(o),
        stream(static_cast<cudaStream_t>(s)), gemm(o.math, s), clock(kPhaseNames, o.profile) {}

  const model::ModelWeights& model_weights;
  model::Qwen35MoeConfig config;
  const std::vector<DeviceLayer>& layers;
  const ExpertTier& tier;
  const float* output_norm;
  VramAccountant& vram;
  PromptPassOptions options;
  cudaStream_t stream;
  Gemm gemm;
  PhaseClock clock;
  DeviceBuffer scratch;
  int64_t score_floats = 0;  // room for [heads][queries][keys] scores, sized for the longest context
  uint64_t miss_bytes = 0;   // expert bytes read over PCIe so far

  float *h, *normed, *mixed, *qg, *kbuf, *vbuf, *attn, *k_rows, *v_rows, *scores, *qkv_raw, *qkv, *z, *b, *alpha, *o;
  float *router, *weights, *xs, *gu, *act, *ys, *sg, *su, *sh, *shared_out, *shared_logit, *expanded;
  int32_t *ids, *sorted, *slot_of, *expert_of, *counts, *first;
  int32_t *host_counts = nullptr, *host_first = nullptr;
  const void** expert_pointers = nullptr;        // device: the matrices a layer's expert products read
  const void** host_expert_pointers = nullptr;   // pinned: their staging on the host
  ExpertTile* expert_tiles = nullptr;            // device: a layer's tiles of rows routed to one expert
  ExpertTile* host_tiles = nullptr;              // pinned: their staging on the host
  uint8_t* staging[2] = {nullptr, nullptr};      // a group's absent experts, copied in by the copy engine
  size_t staging_bytes = 0;                       // each
  bool staging_apart = false;                     // no mixer buffer shares the staging's bytes
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t staged[2] = {nullptr, nullptr}, freed[2] = {nullptr, nullptr}, copies_done = nullptr;
  int64_t staged_groups = 0;                     // groups staged so far: group i uses buffer i % 2
  int32_t* hist;  // group_by_expert's scratch
  std::vector<kernels::ScanRows> scans;  // a DeltaNet layer's sequences, scanned in one launch

  // One allocation, carved as plan::prompt_scratch lays it out (the attention layers', DeltaNet
  // layers' and MoE's own buffers share bytes).
  void allocate_scratch() {
    const model::Qwen35MoeConfig& c = config;
    const plan::PromptScratch l = plan::prompt_scratch(model_weights, options.chunk, options.max_context);
    scratch = DeviceBuffer(vram, l.total, VramUse::scratch, "prompt scratch");
    auto* base = scratch.as<uint8_t>();
    const auto f = [&](size_t at) { return reinterpret_cast<float*>(base + at); };
    const auto i = [&](size_t at) { return reinterpret_cast<int32_t*>(base + at); };
    score_floats = l.score_floats;
    h = f(l.h), normed = f(l.normed), mixed = f(l.mixed), expanded = f(l.expanded);
    expert_pointers = reinterpret_cast<const void**>(base + l.expert_pointers);
    expert_tiles = reinterpret_cast<ExpertTile*>(base + l.expert_tiles);
    staging[0] = base + l.staging, staging[1] = base + l.staging + l.staging_bytes, staging_bytes = l.staging_bytes;
    staging_apart = l.staging_apart;
    qg = f(l.qg), kbuf = f(l.kbuf), vbuf = f(l.vbuf), attn = f(l.attn);
    k_rows = f(l.k_rows), v_rows = f(l.v_rows), scores = f(l.scores);
    qkv_raw = f(l.qkv_raw), qkv = f(l.qkv), z = f(l.z), b = f(l.b), alpha = f(l.alpha), o = f(l.o);
    router = f(l.router), weights = f(l.weights);
    ids = i(l.ids), sorted = i(l.sorted), slot_of = i(l.slot_of), expert_of = i(l.expert_of);
    counts = i(l.counts), first = i(l.first), hist = i(l.hist);
    xs = f(l.xs), gu = f(l.gu), act = f(l.act), ys = f(l.ys);
    sg = f(l.sg), su = f(l.su), sh = f(l.sh), shared_out = f(l.shared_out), shared_logit = f(l.shared_logit);
    check_cuda(cudaMallocHost(&host_counts, size_t(c.n_experts) * 4), "pinned memory");
    check_cuda(cudaMallocHost(&host_first, size_t(c.n_experts) * 4), "pinned memory");
    check_cuda(cudaMallocHost(&host_expert_pointers, size_t(3 * c.n_experts) * sizeof(void*)), "pinned memory");
    check_cuda(cudaMallocHost(&host_tiles, l.expert_tiles_count * sizeof(ExpertTile)), "pinned memory");
    check_cuda(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking), "creating the staging stream");
    for (int b = 0; b < 2; ++b) {
      check_cuda(cudaEventCreateWithFlags(&staged[b], cudaEventDisableTiming), "creating an event");
      check_cuda(cudaEventCreateWithFlags(&freed[b], cudaEventDisableTiming), "creating an event");
    }
    check_cuda(cudaEventCreateWithFlags(&copies_done, cudaEventDisableTiming), "creating an event");
  }

  ~Impl() {
    cudaFreeHost(host_counts);
    cudaFreeHost(host_first);
    cudaFreeHost(host_expert_pointers);
    cudaFreeHost(host_tiles);
    for (int b = 0; b < 2; ++b) {
      if (staged[b]) cudaEventDestroy(staged[b]);
      if (freed[b]) cudaEventDestroy(freed[b]);
    }
    if (copies_done) cudaEventDestroy(copies_done);
    if (copy_stream) cudaStreamDestroy(copy_stream);
  }

  // y [rows][m.rows] = x [rows][m.cols] W^T for each segment's rows alone (the weights expanded
  // once for all); `exact`: in float32 whatever the session's math.
  void project(const DeviceMatrix& m, const float* x, Segments segments, float* y, bool exact = false) {
    clock.mark(elementwise);
    const float* w = nullptr;  // float32 rows of ldw, where the products go through cuBLAS
    int64_t ldw = 0;
    if (m.type == GgmlType::F32) {
      w = static_cast<const float*>(m.data), ldw = int64_t(m.row_bytes / 4);
    } else if (expandable(m.type, m.cols)) {
      check(dequantize(m.type, m.data, nullptr, nullptr, 1, m.rows, m.cols, m.row_bytes, expanded, stream),
            "expanding a weight matrix");
      clock.mark(expand);
      w = expanded, ldw = m.cols;
    }
    for (const PromptSegment& s : segments) {
      const float* in = x + s.start * m.cols;
      float* out = y + s.start * m.rows;
      if (w) gemm.xwt(in, m.cols, w, ldw, out, m.rows, s.rows, m.rows, m.cols, exact);
      else matvec(m.type, m.data, m.rows, m.cols, m.row_bytes, in, out, s.rows, stream);
    }
    clock.mark(dense);
  }

  // The rows the segments span, padding between them included.
  static int64_t spanned(Segments segments) { return segments.back().start + segments.back().rows; }

  void attention(const DeviceLayer& d, size_t layer, Segments segments) {
    const model::Qwen35MoeConfig& c = config;
    const int64_t dim = c.head_dim, q_dim = c.q_dim(), kv_dim = c.kv_dim();
    project(d.q, normed, segments, qg), project(d.k, normed, segments, kbuf), project(d.v, normed, segments, vbuf);
    for (const PromptSegment& s : segments) {
      const LayerState& st = (*s.states)[layer];
      check(kernels::attention_prepare(qg + s.start * 2 * q_dim, kbuf + s.start * kv_dim, vbuf + s.start * kv_dim,
                                       d.q_norm, d.k_norm, st.kv, s.device_first, int(c.n_heads), int(c.n_kv_heads),
                                       int(dim), int(c.rope_dims), c.rope_theta, float(c.rms_eps), int(s.rows),
                                       stream),
            "prompt attention prepare");
      attend(st, s.first, s.rows, qg + s.start * 2 * q_dim, attn + s.start * q_dim);
    }
    const int64_t rows = spanned(segments);
    if (kv::layout(segments.front().states->at(layer).kv.format).v == kv::Store::q4r)  // the products ran in the values' rotated domain
      check(kernels::hadamard_rows(attn, rows * c.n_heads, int(dim), stream), "attention output rotation");
    check(kernels::attention_gate(attn, qg, int(rows), int(c.n_heads), int(dim), stream), "attention gate");
    clock.mark(elementwise);
    project(d.o, attn, segments, mixed);
  }

  // One sequence's n queries (q: their q|gate rows) over its cache up to position first + n,
  // softmax(q K^T / sqrt(dim)) V into out ([n][q_dim]).
  void attend(const LayerState& st, int64_t first_position, int64_t n, const float* q, float* out) {
    const model::Qwen35MoeConfig& c = config;
    const int64_t dim = c.head_dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), group = c.n_heads / c.n_kv_heads;
    // The cache as float32 rows: what the decode step reads, whatever the format (q was rotated
    // with the keys when they are stored rotated).
    check(kernels::kv_to_rows(st.kv, first_position + n, kv_dim, k_rows, v_rows, stream), "reading the K/V cache");
    clock.mark(elementwise);
    // As many queries per block as the scores' room holds at this chunk's last key (a short
    // context in a long allocation takes whole chunks at once).
    const int64_t queries_per_block = std::clamp<int64_t>(score_floats / (c.n_heads * (first_position + n)), 1, n);
    for (int64_t q0 = 0; q0 < n; q0 += queries_per_block) {
      const int64_t tq = std::min(queries_per_block, n - q0), keys = first_position + q0 + tq;
      for (int64_t g = 0; g < c.n_kv_heads; ++g)
        gemm.xwt_batched(q + q0 * 2 * q_dim + g * group * 2 * dim, 2 * q_dim, 2 * dim, k_rows + g * dim, kv_dim, 0,
                         scores + g * group * tq * keys, keys, tq * keys, tq, keys, dim, group);
      check(kernels::causal_softmax(scores, int(c.n_heads), int(tq), keys, first_position + q0,
                                    1.0f / std::sqrt(float(dim)), stream),
            "prompt attention softmax");
      for (int64_t g = 0; g < c.n_kv_heads; ++g)
        gemm.xw_batched(scores + g * group * tq * keys, keys, tq * keys, v_rows + g * dim, kv_dim, 0,
                        out + q0 * q_dim + g * group * dim, q_dim, dim, tq, dim, keys, group);
    }
    clock.mark(attention_core);
  }

  void deltanet(const DeviceLayer& d, size_t layer, Segments segments) {
    const model::Qwen35MoeConfig& c = config;
    project(d.qkv, normed, segments, qkv_raw), project(d.z, normed, segments, z);
    project(d.b, normed, segments, b), project(d.alpha, normed, segments, alpha);
    const int channels = int(c.conv_channels());
    const int64_t values = c.ssm_dt_rank * c.ssm_state;  // o's and z's rows
    // Each sequence's conv and norms, then every sequence's scan in one launch (the scan's blocks
    // are few for one sequence: several sequences run side by side), then the gated norms.
    scans.clear();
    for (const PromptSegment& s : segments) {
      const LayerState& st = (*s.states)[layer];
      float* in = qkv + s.start * channels;
      check(kernels::deltanet_conv_rows(qkv_raw + s.start * d.qkv.rows, in, st.conv_state, d.conv, channels,
                                        int(c.ssm_conv_kernel), int(s.rows), stream),
            "prompt DeltaNet conv");
      check(kernels::l2_norm_heads(in, int(c.ssm_groups), int(c.ssm_state), channels, int(s.rows), stream),
            "prompt DeltaNet norms");
      scans.push_back({st.ssm_state, in, b + s.start * d.b.rows, alpha + s.start * d.alpha.rows, o + s.start * values,
                       int(s.rows)});
    }
    clock.mark(deltanet_conv);
    check(kernels::deltanet_scan(scans.data(), int(scans.size()), channels, d.a, d.dt_bias, int(c.ssm_groups),
                                 int(c.ssm_dt_rank), int(c.ssm_state), int(c.ssm_state), stream),
          "prompt DeltaNet scan");
    for (const PromptSegment& s : segments)
      check(kernels::gated_norm_rows(o + s.start * values, z + s.start * d.z.rows, d.norm, int(s.rows * c.ssm_dt_rank),
                                     int(c.ssm_state), float(c.rms_eps), stream),
            "prompt DeltaNet norm");
    clock.mark(deltanet_core);
    project(d.out, o, segments, mixed);
  }

  // A layer's experts are multiplied from their stored bytes on tensor cores (expert_products), in
  // tiles of at most kExpertTileRows of the rows routed to one expert; in float32 math, for a type
  // without an expansion unit, or where the kernel cannot take the matrices, by one matrix-vector
  // product per sorted row instead. Decided per layer from the file and the device, never from
  // the budget (the two ways round differently).
  struct ExpertPaths {
    bool gate_up = false, down = false;  // on the tensor cores
  };
  std::vector<ExpertPaths> paths;  // per layer

  // The kernel copies a matrix's blocks in 16-byte pieces, so where the type needs it a matrix must
  // start on a 16-byte boundary in its VRAM slot (whose projections follow each other unpadded;
  // slots start on 256, as staging pieces do); and its shared memory must fit the device.
  bool on_tensor_cores(const DeviceExperts& e, size_t offset_in_slot, int shared_limit) const {
    return options.math == PromptMath::tf32 && has_expert_products(e.type, e.cols) &&
           expert_products_aligned(e.type, offset_in_slot, e.row_bytes) &&
           expert_products_shared_bytes(e.type) <= size_t(shared_limit);
  }
  void choose_paths() {
    int device = 0, shared_limit = 0;
    check_cuda(cudaGetDevice(&device), "the current device");
    check_cuda(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
               "the device's shared memory");
    for (size_t l = 0; l < layers.size(); ++l) {
      const DeviceLayer& d = layers[l];
      const size_t gate = tier.projection_bytes(int64_t(l), 0), up = tier.projection_bytes(int64_t(l), 1);
      paths.push_back({on_tensor_cores(d.gate, 0, shared_limit) && on_tensor_cores(d.up, gate, shared_limit),
                       on_tensor_cores(d.down, gate + up, shared_limit)});
    }
  }

  // Absent experts are staged kGroup at a time: the copy engine fills one staging buffer while the
  // products read the other.
  static constexpr int64_t kGroup = plan::kPromptExpertGroup;

  // The chunk's experts of [begin, end) (those with rows), in order.
  std::vector<int32_t> used_in(int64_t begin, int64_t end) const {
    std::vector<int32_t> used;
    for (int64_t e = begin; e < end; ++e)
      if (host_counts[e] > 0) used.push_back(int32_t(e));
    return used;
  }

  // Products off the tensor cores: one matrix-vector product per sorted row.
  void per_row(const DeviceExperts& e, const float* x, int64_t ldx, float* y, int64_t rows) {
    for (int64_t p = 0; p < rows; p += kMaxMatvecProblems) {
      const int64_t count = std::min(kMaxMatvecProblems, rows - p);
      grouped_matvec(e.type, e.table, expert_of + p, count, e.rows, e.cols, e.row_bytes, x + p * ldx, ldx,
                     y + p * e.rows, stream);
    }
  }

  // The products read a layer's matrices through expert_pointers, written once per layer (host,
  // then one copy) with the layer's tiles: for the j-th expert the chunk routes to, gate|up as the
  // pair (2j, 2j + 1) when one table holds both (else gate's at j, up's at used + j), down's at
  // 2 used + j. A resident expert's entries point at its VRAM slot; an absent one's at its place in
  // a staging buffer, into which the copy engine moves it (one batch per group of kGroup experts,
  // on its own stream) while the previous group multiplies: the products then read VRAM, and the
  // PCIe transfer leaves the GPU's cores free. (Staging sits in the MoE's share of the prompt
  // scratch. Where no attention or DeltaNet buffer shares its bytes, a layer's first two groups
  // are copied during its mixer (speculate); otherwise copies start after the routing's host sync.
  // They end before the layer's last product.)
  struct Staged {
    int buffer = -1;  // -1: every expert of the group is resident
    std::vector<void*> dst;
    std::vector<const void*> src;
    std::vector<size_t> size;
    bool copied = false;  // already copied in by speculate()
    bool same_copies(const Staged& o) const { return buffer == o.buffer && dst == o.dst && src == o.src && size == o.size; }
  };
  struct LayerPlan {
    ExpertPaths paths;
    int64_t used = 0;            // experts the chunk routes to
    std::vector<int64_t> tiles;  // group g's tiles are [tiles[g], tiles[g + 1]) (tiles[0] = 0)
    std::vector<Staged> gate_up, down;
  };
  // Where a pass's pointer entries go: entry (i, p) of the group's i-th expert at at[i * stride +
  // p * second] (not written when `at` is null).
  struct Entries {
    const void** at = nullptr;
    int64_t stride = 1, second = 0;
  };
  // The entry for projection p of expert e, the i-th of its group, `offset` into its staging place
  // (`groups`: the groups given a buffer so far).
  const void* entry(Staged& st, int64_t layer, int p, int32_t e, size_t i, size_t piece, size_t offset,
                    int64_t& groups) {
    if (tier.resident(layer, e)) return tier.device_pointer(layer, p, e);
    if (st.buffer < 0) st.buffer = int(groups++ % 2);
    uint8_t* dst = staging[st.buffer] + i * piece + offset;
    st.dst.push_back(dst);
    st.src.push_back(tier.host_pointer(layer, p, e));
    st.size.push_back(tier.projection_bytes(layer, p));
    return dst;
  }

  // A gate|up group's entries for its `used` experts, and its staging.
  Staged gate_up_group(int64_t layer, const std::vector<int32_t>& used, int64_t& groups, Entries to) {
    const plan::StagingPieces piece = plan::staging_pieces(model_weights.layers[size_t(layer)].moe);
    Staged st;
    for (size_t i = 0; i < used.size(); ++i) {
      const void* gate = entry(st, layer, 0, used[i], i, piece.gate_up, 0, groups);
      const void* up = entry(st, layer, 1, used[i], i, piece.gate_up, piece.up_at, groups);
      if (to.at) to.at[int64_t(i) * to.stride] = gate, to.at[int64_t(i) * to.stride + to.second] = up;
    }
    return st;
  }

  // Before a layer's mixer: its first two gate|up groups with absent experts copied in as if the
  // chunk routed to every expert of them (one of thousands of tokens nearly always does), so that
  // the copy engine works through the mixer and the routing instead of waiting for them;
  // plan_layer keeps the copies its plan matches and copies again where it does not. Only where no
  // mixer buffer shares the staging's bytes.
  std::vector<Staged> speculated;
  void speculate(int64_t layer, int64_t tokens) {
    speculated.clear();
    const int64_t n = config.n_experts;
    if (!staging_apart || !paths[size_t(layer)].gate_up || tokens * config.n_experts_used < 16 * n)
      return;
    int64_t groups = staged_groups;
    for (int64_t g = 0; g < n && speculated.size() < 2; g += kGroup) {
      std::vector<int32_t> all;
      for (int64_t e = g; e < std::min(g + kGroup, n); ++e) all.push_back(int32_t(e));
      Staged st = gate_up_group(layer, all, groups, {});
      if (st.buffer < 0) continue;
      copy_in(st);
      speculated.push_back(std::move(st));
    }
  }

  // Entry (i, p) of the layer's pointer table for the pass that starts at `base`.
  static Entries entries_at(const void** base, int64_t j, bool pairs, int64_t used) {
    return pairs ? Entries{base + 2 * j, 2, 1} : Entries{base + j, 1, used};
  }

  // The layer's tiles, pointer entries and staging; passes off the tensor cores stage nothing.
  LayerPlan plan_layer(const DeviceLayer& d, int64_t layer) {
    const int64_t n = config.n_experts;
    const plan::StagingPieces piece = plan::staging_pieces(model_weights.layers[size_t(layer)].moe);
    LayerPlan plan;
    plan.paths = paths[size_t(layer)];
    std::vector<std::vector<int32_t>> groups;  // each group's experts with rows
    for (int64_t g = 0; g < n; g += kGroup) {
      groups.push_back(used_in(g, std::min(g + kGroup, n)));
      plan.used += int64_t(groups.back().size());
    }
    // The groups take staging buffers in the order their products run: every gate|up group, then
    // every down group.
    int64_t j = 0, n_tiles = 0;
    plan.tiles = {0};
    for (const std::vector<int32_t>& used : groups) {
      for (size_t i = 0; i < used.size(); ++i)
        for (int32_t r = 0; r < host_counts[used[i]]; r += int32_t(kExpertTileRows))
          host_tiles[n_tiles++] = {int32_t(j + int64_t(i)), host_first[used[i]] + r,
                                   std::min(int32_t(kExpertTileRows), host_counts[used[i]] - r), 0};
      plan.tiles.push_back(n_tiles);
      Staged& st = plan.gate_up.emplace_back();
      if (plan.paths.gate_up) {
        st = gate_up_group(layer, used, staged_groups, entries_at(host_expert_pointers, j, pairs(d), plan.used));
        for (const Staged& s : speculated) st.copied |= st.buffer >= 0 && st.same_copies(s);
      }
      j += int64_t(used.size());
    }
    speculated.clear();
    j = 0;
    for (const std::vector<int32_t>& used : groups) {
      Staged& st = plan.down.emplace_back();
      if (plan.paths.down)
        for (size_t i = 0; i < used.size(); ++i)
          host_expert_pointers[2 * plan.used + j + int64_t(i)] =
              entry(st, layer, 2, used[i], i, piece.down, 0, staged_groups);
      j += int64_t(used.size());
    }
    check_cuda(cudaMemcpyAsync(expert_pointers, host_expert_pointers, size_t(3 * plan.used) * sizeof(void*),
                               cudaMemcpyHostToDevice, stream),
               "expert pointers to the device");
    check_cuda(cudaMemcpyAsync(expert_tiles, host_tiles, size_t(n_tiles) * sizeof(ExpertTile), cudaMemcpyHostToDevice,
                               stream),
               "expert tiles to the device");
    return plan;
  }
  // Whether gate and up share one table: each expert's gate|up rows are then one matrix of 2 ff rows.
  static bool pairs(const DeviceLayer& d) { return d.gate_up.table != nullptr; }

  // Before a group's products: its absent experts copied into its staging buffer once the group
  // two before is done with it (unless speculate() did), and the step's stream waiting for them.
  void stage(const Staged& st) {
    if (st.buffer < 0) return;
    if (!st.copied) copy_in(st);
    check_cuda(cudaStreamWaitEvent(stream, staged[st.buffer]), "staging experts");
  }
  void copy_in(const Staged& st) {
    const int b = st.buffer;
    check_cuda(cudaStreamWaitEvent(copy_stream, freed[b]), "staging experts");
    cudaMemcpyAttributes attributes{};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t first_index = 0;
    if (cudaMemcpyBatchAsync(st.dst.data(), st.src.data(), st.size.data(), st.dst.size(), &attributes, &first_index, 1,
                             copy_stream) != cudaSuccess) {
      cudaGetLastError();  // no batches here: one copy each
      for (size_t i = 0; i < st.dst.size(); ++i)
        check_cuda(cudaMemcpyAsync(st.dst[i], st.src[i], st.size[i], cudaMemcpyHostToDevice, copy_stream), "staging experts");
    }
    check_cuda(cudaEventRecord(staged[b], copy_stream), "staging experts");
  }
  // After a group's last product: its buffer may take the group after next.
  void release(const Staged& st) {
    if (st.buffer >= 0) check_cuda(cudaEventRecord(freed[st.buffer], stream), "staging experts");
  }

  // launch(first tile, end tile) over the layer's groups: each run of groups without staged experts
  // in one launch; a group with staged experts alone, after its copies, releasing its buffer after.
  template <class Launch>
  void over_groups(const LayerPlan& plan, const std::vector<Staged>& staging_of, Launch launch) {
    const auto run = [&](int64_t begin, int64_t end) {
      if (end > begin) launch(begin, end);
    };
    size_t pending = 0;  // the first group not yet launched
    for (size_t g = 0; g + 1 < plan.tiles.size(); ++g) {
      if (staging_of[g].buffer < 0) continue;
      run(plan.tiles[pending], plan.tiles[g]);
      stage(staging_of[g]);
      run(plan.tiles[g], plan.tiles[g + 1]);
      release(staging_of[g]);
      pending = g + 1;
    }
    run(plan.tiles[pending], plan.tiles.back());
    clock.mark(experts);
  }

  // y = x W^T over tiles [begin, end), W the pass's matrices through `table` (parts of part_rows).
  void products(const DeviceExperts& e, int64_t begin, int64_t end, const void* const* table, int64_t parts,
                const float* x, int64_t ldx, float* y, int64_t ldy) {
    TileRows rows{int32_t(kExpertTileRows), 0};
    for (int64_t i = begin; i < end; ++i)
      rows.fewest = std::min(rows.fewest, host_tiles[i].rows), rows.most = std::max(rows.most, host_tiles[i].rows);
    check(expert_products(e.type, expert_tiles + begin, end - begin, rows, table, parts, e.rows, e.cols, e.row_bytes,
                          x, ldx, y, ldy, stream),
          "expert products");
  }

  void experts_gate_up(const DeviceLayer& d, int64_t rows, const LayerPlan& plan) {
    const int64_t ff = config.expert_ff, hidden = config.hidden;
    if (!plan.paths.gate_up) {
      per_row(d.gate, xs, hidden, ys, rows);
      per_row(d.up, xs, hidden, ys + rows * ff, rows);
      clock.mark(experts);
      check(kernels::swiglu_rows(ys, ys + rows * ff, ff, int(rows), int(ff), plan.paths.down, act, stream),
            "expert swiglu");
      return;
    }
    over_groups(plan, plan.gate_up, [&](int64_t begin, int64_t end) {
      if (pairs(d)) return products(d.gate, begin, end, expert_pointers, 2, xs, hidden, gu, 2 * ff);
      products(d.gate, begin, end, expert_pointers, 1, xs, hidden, gu, 2 * ff);
      products(d.up, begin, end, expert_pointers + plan.used, 1, xs, hidden, gu + ff, 2 * ff);
    });
    check(kernels::swiglu_rows(gu, gu + ff, 2 * ff, int(rows), int(ff), plan.paths.down, act, stream),
          "expert swiglu");
    clock.mark(elementwise);
  }

  void experts_down(const DeviceLayer& d, int64_t rows, const LayerPlan& plan) {
    const int64_t ff = config.expert_ff, hidden = config.hidden;
    if (!plan.paths.down) return per_row(d.down, act, ff, ys, rows);
    over_groups(plan, plan.down, [&](int64_t begin, int64_t end) {
      products(d.down, begin, end, expert_pointers + 2 * plan.used, 1, act, ff, ys, hidden);
    });
  }

  // Where each segment's rows start among the rows the experts take (the segments' rows without
  // the padding between them).
  static std::vector<int64_t> packed_starts(Segments segments) {
    std::vector<int64_t> at;
    int64_t n = 0;
    for (const PromptSegment& s : segments) at.push_back(n), n += s.rows;
    at.push_back(n);
    return at;
  }

  // The router's choices of every segment's rows, packed (the padding left out), grouped by expert;
  // the normed rows gathered in that order into xs. Returns the (row, slot) pairs.
  int64_t route(const DeviceLayer& d, int64_t layer, Segments segments, const std::vector<int64_t>& packed) {
    const model::Qwen35MoeConfig& c = config;
    const int64_t k = c.n_experts_used, hidden = c.hidden, n = packed.back();
    project(d.router, normed, segments, router, true);
    const RouteTally tally{d.tally.counts, d.tally.resident, d.tally.misses ? d.tally.misses + c.n_layers : nullptr};
    bool in_place = true;
    for (size_t i = 0; i < segments.size(); ++i) {
      const PromptSegment& s = segments[i];
      check(kernels::moe_route(router + s.start * d.router.rows, int(c.n_experts), int(k), int(s.rows),
                               ids + packed[i] * 2 * k, weights + packed[i] * k, tally, stream),
            "prompt router");
      in_place = in_place && s.start == packed[i];
    }
    // The normed rows packed where padding parts them: into mixed, free until the expert sum writes it.
    const float* rows = in_place ? normed : mixed;
    for (size_t i = 0; i < segments.size() && !in_place; ++i)
      check_cuda(cudaMemcpyAsync(mixed + packed[i] * hidden, normed + segments[i].start * hidden,
                                 size_t(segments[i].rows * hidden) * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                 "packing the normed rows");
    check(kernels::group_by_expert(ids, int(n), int(k), int(c.n_experts), sorted, slot_of, expert_of, counts, first,
                                   hist, stream),
          "grouping by expert");
    check_cuda(cudaMemcpyAsync(host_counts, counts, size_t(c.n_experts) * 4, cudaMemcpyDeviceToHost, stream),
               "expert counts to the host");
    check_cuda(cudaMemcpyAsync(host_first, first, size_t(c.n_experts) * 4, cudaMemcpyDeviceToHost, stream),
               "expert offsets to the host");
    check(kernels::gather_rows(rows, sorted, int(k), int(n * k), int(hidden), paths[size_t(layer)].gate_up, xs, stream),
          "gathering expert inputs");
    check_cuda(cudaStreamSynchronize(stream), "routing a prompt chunk");
    clock.mark(routing);
    return n * k;
  }

  void moe(const DeviceLayer& d, int64_t layer, Segments segments) {
    const model::Qwen35MoeConfig& c = config;
    const int64_t k = c.n_experts_used, hidden = c.hidden;
    const std::vector<int64_t> packed = packed_starts(segments);
    const int64_t pairs = route(d, layer, segments, packed);
    for (int32_t e : used_in(0, c.n_experts))
      if (!tier.resident(layer, e)) miss_bytes += tier.expert_bytes(layer);
    const LayerPlan plan = plan_layer(d, layer);
    experts_gate_up(d, pairs, plan);
    experts_down(d, pairs, plan);
    const bool shared = c.shared_ff > 0;
    if (shared) {
      project(d.shared_gate, normed, segments, sg), project(d.shared_up, normed, segments, su);
      check(kernels::swiglu(sg, su, sh, spanned(segments) * c.shared_ff, stream), "shared swiglu");
      project(d.shared_down, sh, segments, shared_out);
      project(d.shared_logit, normed, segments, shared_logit, true);
    }
    for (size_t i = 0; i < segments.size(); ++i) {
      const PromptSegment& s = segments[i];
      check(kernels::moe_combine_rows(ys, slot_of + packed[i] * k, weights + packed[i] * k, int(k),
                                      shared ? shared_out + s.start * hidden : nullptr,
                                      shared_logit + s.start * d.shared_logit.rows, int(s.rows), int(hidden),
                                      mixed + s.start * hidden, stream),
            "prompt expert sum");
    }
    clock.mark(elementwise);
  }

  void run(Segments segments) {
    const model::Qwen35MoeConfig& c = config;
    const float eps = float(c.rms_eps);
    const int hidden = int(c.hidden), rows = int(spanned(segments));
    int64_t tokens = 0;
    for (const PromptSegment& s : segments) tokens += s.rows;
    clock.start();
    if (!options.hand_in)
      check(kernels::rms_norm(h, layers.front().attn_norm, normed, rows, hidden, eps, stream), "prompt norm");
    for (size_t l = 0; l < layers.size(); ++l) {
      const DeviceLayer& d = layers[l];
      speculate(int64_t(l), tokens);
      d.recurrent ? deltanet(d, l, segments) : attention(d, l, segments);
      check(kernels::add_rms_norm(h, mixed, d.post_norm, normed, rows, hidden, eps, stream), "prompt residual");
      moe(d, int64_t(l), segments);
      const float* next_norm = l + 1 < layers.size() ? layers[l + 1].attn_norm : output_norm;
      check(kernels::add_rms_norm(h, mixed, next_norm, normed, rows, hidden, eps, stream), "prompt residual");
    }
    // Every copy in before the chunk ends (a speculated one the plan did not keep has no waiter).
    check_cuda(cudaEventRecord(copies_done, copy_stream), "staging experts");
    check_cuda(cudaStreamWaitEvent(stream, copies_done), "staging experts");
    clock.mark(elementwise);
  }
};

std::vector<int64_t> prompt_row_starts(std::span<const int64_t> lengths) {
  std::vector<int64_t> starts;
  int64_t at = 0;
  for (int64_t n : lengths) {
    if (n < 1) fail("cuda prompt pass: a piece of {} tokens", n);
    starts.push_back(at);
    at = (at + n + kPromptRowAlign - 1) / kPromptRowAlign * kPromptRowAlign;
  }
  starts.push_back(lengths.empty() ? 0 : starts.back() + lengths.back());
  return starts;
}

PromptPass::PromptPass(const model::ModelWeights& weights, const std::vector<DeviceLayer>& layers,
                       const ExpertTier& tier, const float* output_norm, VramAccountant& vram,
                       PromptPassOptions options, void* stream)
    : impl_(std::make_unique<Impl>(weights, layers, tier, output_norm, vram, options, stream)) {
  if (options.chunk <= 0 || options.chunk > 65535)
    fail("cuda prompt pass: a chunk of {} tokens; it must hold 1 to 65535", options.chunk);
  impl_->allocate_scratch();
  impl_->choose_paths();
}

PromptPass::~PromptPass() = default;

float* PromptPass::input_rows() { return impl_->h; }
float* PromptPass::normed_rows() { return impl_->normed; }

void PromptPass::run(std::span<const PromptSegment> segments) {
  if (segments.empty()) fail("cuda prompt pass: no rows to run");
  const int64_t chunk = impl_->options.chunk;
  std::vector<int64_t> lengths;
  for (const PromptSegment& s : segments) lengths.push_back(s.rows);
  const std::vector<int64_t> starts = prompt_row_starts(lengths);
  if (starts.back() > chunk)
    fail("cuda prompt pass: {} pieces spanning {} rows for a chunk of {}", segments.size(), starts.back(), chunk);
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].start != starts[i])
      fail("cuda prompt pass: piece {} starts at row {}, not {} (prompt_row_starts)", i, segments[i].start, starts[i]);
    if (!segments[i].states || segments[i].states->size() != impl_->layers.size())
      fail("cuda prompt pass: piece {} holds no state for each of the {} layers", i, impl_->layers.size());
    for (size_t j = 0; j < i; ++j)
      if (segments[j].states == segments[i].states) fail("cuda prompt pass: pieces {} and {} are one sequence's", j, i);
  }
  impl_->run(segments);
}

const float* PromptPass::output_rows() const { return impl_->normed; }
int64_t PromptPass::chunk() const { return impl_->options.chunk; }
uint64_t PromptPass::miss_bytes() const { return impl_->miss_bytes; }
uint8_t* PromptPass::staging(int buffer) const { return impl_->staging[buffer]; }
size_t PromptPass::staging_bytes() const { return impl_->staging_bytes; }
std::vector<std::pair<std::string, double>> PromptPass::profile() const { return impl_->clock.totals(); }

}  // namespace lode::cuda
