#include "cuda/prompt_pass.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "cuda/dequant.h"
#include "cuda/forward_kernels.h"
#include "cuda/matvec.h"
#include "cuda/phase_clock.h"
#include "cuda/prompt_kernels.h"
#include "cuda/vram.h"

namespace lode::cuda {

namespace {

void check(const char* err, const char* what) {
  if (err) fail("CUDA: {}: {}", what, err);
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail("CUDA: {}: {}", what, cudaGetErrorString(err));
}

// Attention scores of one block of queries are [heads][queries][keys] floats; this many bytes at most.
constexpr int64_t kScoreBytes = int64_t(256) << 20;

// The grid i-quants have no expansion kernel: their products go through the matrix-vector kernels
// (one launch covers at most this many products).
constexpr int64_t kMaxMatvecProblems = 65535;

bool expandable(GgmlType type, int64_t cols) { return has_dequantize(type) && cols % 32 == 0; }

enum Phase : size_t { expand, dense, attention_core, deltanet_conv, deltanet_core, routing, expert_products, elementwise };
const std::vector<std::string> kPhaseNames = {"expanding weights",        "dense products (cuBLAS)",
                                              "attention core",           "DeltaNet conv and L2 norms",
                                              "DeltaNet scan and norm",   "routing (with a host sync)",
                                              "expert products (cuBLAS)", "norms, swiglu, sums"};

}  // namespace

struct PromptPass::Impl {
  Impl(const model::Qwen35MoeConfig& c, const std::vector<DeviceLayer>& l, const float* on, VramAccountant& v,
       PromptPassOptions o, void* s)
      : config(c), layers(l), output_norm(on), vram(v), options(o), stream(static_cast<cudaStream_t>(s)),
        gemm(o.math, s), clock(kPhaseNames, o.profile) {}

  model::Qwen35MoeConfig config;
  const std::vector<DeviceLayer>& layers;
  const float* output_norm;
  VramAccountant& vram;
  PromptPassOptions options;
  cudaStream_t stream;
  Gemm gemm;
  PhaseClock clock;
  std::vector<DeviceBuffer> buffers;
  int64_t score_floats = 0;  // room for [heads][queries][keys] scores, sized for the longest context

  float *h, *normed, *mixed, *qg, *kbuf, *vbuf, *attn, *k_rows, *v_rows, *scores, *qkv_raw, *qkv, *z, *b, *alpha, *o;
  float *router, *weights, *xs, *gu, *act, *ys, *sg, *su, *sh, *shared_out, *shared_logit, *expanded;
  int32_t *ids, *sorted, *slot_of, *expert_of, *counts, *first, *gate_up_order;
  int32_t *host_counts = nullptr, *host_first = nullptr;
  int32_t* hist;  // group_by_expert's scratch
  const float **pointer_w, **pointer_x;
  float** pointer_y;
  bool grouped_supported = true;

  void* allocate(int64_t bytes, const char* what) {
    buffers.emplace_back(vram, size_t(std::max<int64_t>(bytes, 4)), VramUse::scratch, std::string("prompt ") + what);
    return buffers.back().data();
  }
  float* floats(int64_t n, const char* what) { return static_cast<float*>(allocate(n * 4, what)); }
  int32_t* ints(int64_t n, const char* what) { return static_cast<int32_t*>(allocate(n * 4, what)); }

  // The most floats any one expansion needs: a dense matrix, or one projection of all experts.
  int64_t expansion_floats() const {
    int64_t most = 0;
    const auto dense = [&](const DeviceMatrix& m) {
      if (m.data && m.type != GgmlType::F32 && expandable(m.type, m.cols)) most = std::max(most, m.rows * m.cols);
    };
    const auto experts = [&](const DeviceExperts& e, int64_t n) {
      if (e.table && expandable(e.type, e.cols)) most = std::max(most, n * e.rows * e.cols);
    };
    for (const DeviceLayer& d : layers) {
      for (const DeviceMatrix* m : {&d.q, &d.k, &d.v, &d.o, &d.qkv, &d.z, &d.b, &d.alpha, &d.out, &d.router,
                                    &d.shared_gate, &d.shared_up, &d.shared_down})
        dense(*m);
      experts(d.gate_up, 2 * config.n_experts);
      experts(d.gate, config.n_experts), experts(d.up, config.n_experts), experts(d.down, config.n_experts);
    }
    return most;
  }

  void allocate_scratch() {
    const model::Qwen35MoeConfig& c = config;
    const int64_t n = options.chunk, k = c.n_experts_used, rows = n * k;
    h = floats(n * c.hidden, "h"), normed = floats(n * c.hidden, "normed"), mixed = floats(n * c.hidden, "mixed");
    qg = floats(n * 2 * c.q_dim(), "q|gate"), kbuf = floats(n * c.kv_dim(), "k"), vbuf = floats(n * c.kv_dim(), "v");
    attn = floats(n * c.q_dim(), "attention");
    k_rows = floats(options.max_context * c.kv_dim(), "K rows"), v_rows = floats(options.max_context * c.kv_dim(), "V rows");
    const int64_t score_row = c.n_heads * options.max_context * 4;
    score_floats = c.n_heads * std::clamp<int64_t>(kScoreBytes / std::max<int64_t>(score_row, 1), 1, n) *
                   options.max_context;
    scores = floats(score_floats, "attention scores");
    qkv_raw = floats(n * c.conv_channels(), "qkv before the conv"), qkv = floats(n * c.conv_channels(), "qkv"), z = floats(n * c.ssm_value_dim(), "z");
    b = floats(n * c.ssm_dt_rank, "b"), alpha = floats(n * c.ssm_dt_rank, "alpha"), o = floats(n * c.ssm_value_dim(), "o");
    router = floats(n * c.n_experts, "router"), weights = floats(rows, "route weights");
    ids = ints(2 * rows, "route ids"), sorted = ints(rows, "sorted"), slot_of = ints(rows, "slots");
    expert_of = ints(rows, "experts"), counts = ints(c.n_experts, "counts"), first = ints(c.n_experts, "firsts");
    hist = ints(32 * c.n_experts, "expert histogram");
    pointer_w = static_cast<const float**>(allocate(c.n_experts * 8, "grouped weights"));
    pointer_x = static_cast<const float**>(allocate(c.n_experts * 8, "grouped inputs"));
    pointer_y = static_cast<float**>(allocate(c.n_experts * 8, "grouped outputs"));
    xs = floats(rows * c.hidden, "expert inputs"), gu = floats(rows * 2 * c.expert_ff, "expert gate|up");
    act = floats(rows * c.expert_ff, "expert activations");
    ys = floats(rows * std::max(c.hidden, 2 * c.expert_ff), "expert outputs");
    sg = floats(n * c.shared_ff, "shared gate"), su = floats(n * c.shared_ff, "shared up");
    sh = floats(n * c.shared_ff, "shared activations"), shared_out = floats(n * c.hidden, "shared out");
    shared_logit = floats(n, "shared logit");
    expanded = floats(expansion_floats(), "expanded weights");
    std::vector<int32_t> order;  // gate e then up e: each expert's gate|up rows contiguous
    for (int64_t e = 0; e < c.n_experts; ++e) order.push_back(int32_t(e)), order.push_back(int32_t(c.n_experts + e));
    gate_up_order = ints(int64_t(order.size()), "gate|up order");
    copy_to_device(gate_up_order, order.data(), order.size() * 4);
    check_cuda(cudaMallocHost(&host_counts, size_t(c.n_experts) * 4), "pinned memory");
    check_cuda(cudaMallocHost(&host_first, size_t(c.n_experts) * 4), "pinned memory");
  }

  ~Impl() {
    cudaFreeHost(host_counts);
    cudaFreeHost(host_first);
  }

  // y [n][m.rows] = x [n][m.cols] W^T; `exact`: in float32 whatever the session's math.
  void project(const DeviceMatrix& m, const float* x, int64_t n, float* y, bool exact = false) {
    clock.mark(elementwise);
    if (m.type == GgmlType::F32) {
      gemm.xwt(x, m.cols, static_cast<const float*>(m.data), int64_t(m.row_bytes / 4), y, m.rows, n, m.rows, m.cols,
               exact);
    } else if (expandable(m.type, m.cols)) {
      check(dequantize(m.type, m.data, nullptr, nullptr, 1, m.rows, m.cols, m.row_bytes, expanded, stream),
            "expanding a weight matrix");
      clock.mark(expand);
      gemm.xwt(x, m.cols, expanded, m.cols, y, m.rows, n, m.rows, m.cols, exact);
    } else {
      matvec(m.type, m.data, m.rows, m.cols, m.row_bytes, x, y, n, stream);
    }
    clock.mark(dense);
  }

  void attention(const DeviceLayer& d, int64_t n, const int64_t* device_first, int64_t first_position) {
    const model::Qwen35MoeConfig& c = config;
    const int64_t dim = c.head_dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), group = c.n_heads / c.n_kv_heads;
    project(d.q, normed, n, qg), project(d.k, normed, n, kbuf), project(d.v, normed, n, vbuf);
    check(kernels::attention_prepare(qg, kbuf, vbuf, d.q_norm, d.k_norm, d.kv, device_first,
                                     int(c.n_heads), int(c.n_kv_heads), int(dim), int(c.rope_dims), c.rope_theta,
                                     float(c.rms_eps), int(n), stream),
          "prompt attention prepare");
    // The cache as float32 rows: what the decode step reads, whatever the format (q was rotated
    // with the keys when they are stored rotated).
    check(kernels::kv_to_rows(d.kv, first_position + n, kv_dim, k_rows, v_rows, stream), "reading the K/V cache");
    clock.mark(elementwise);
    // As many queries per block as the scores' room holds at this chunk's last key (a short
    // context in a long allocation takes whole chunks at once).
    const int64_t queries_per_block = std::clamp<int64_t>(score_floats / (c.n_heads * (first_position + n)), 1, n);
    for (int64_t q0 = 0; q0 < n; q0 += queries_per_block) {
      const int64_t tq = std::min(queries_per_block, n - q0), keys = first_position + q0 + tq;
      for (int64_t g = 0; g < c.n_kv_heads; ++g)
        gemm.xwt_batched(qg + q0 * 2 * q_dim + g * group * 2 * dim, 2 * q_dim, 2 * dim, k_rows + g * dim, kv_dim, 0,
                         scores + g * group * tq * keys, keys, tq * keys, tq, keys, dim, group);
      check(kernels::causal_softmax(scores, int(c.n_heads), int(tq), keys, first_position + q0,
                                    1.0f / std::sqrt(float(dim)), stream),
            "prompt attention softmax");
      for (int64_t g = 0; g < c.n_kv_heads; ++g)
        gemm.xw_batched(scores + g * group * tq * keys, keys, tq * keys, v_rows + g * dim, kv_dim, 0,
                        attn + q0 * q_dim + g * group * dim, q_dim, dim, tq, dim, keys, group);
    }
    if (kv::layout(d.kv.format).v == kv::Store::q4r)  // the products ran in the values' rotated domain
      check(kernels::hadamard_rows(attn, n * c.n_heads, int(dim), stream), "attention output rotation");
    check(kernels::attention_gate(attn, qg, int(n), int(c.n_heads), int(dim), stream), "attention gate");
    clock.mark(attention_core);
    project(d.o, attn, n, mixed);
  }

  void deltanet(const DeviceLayer& d, int64_t n) {
    const model::Qwen35MoeConfig& c = config;
    project(d.qkv, normed, n, qkv_raw), project(d.z, normed, n, z);
    project(d.b, normed, n, b), project(d.alpha, normed, n, alpha);
    const int channels = int(c.conv_channels());
    check(kernels::deltanet_conv_rows(qkv_raw, qkv, d.conv_state, d.conv, channels, int(c.ssm_conv_kernel), int(n),
                                      stream),
          "prompt DeltaNet conv");
    check(kernels::l2_norm_heads(qkv, int(c.ssm_groups), int(c.ssm_state), channels, int(n), stream),
          "prompt DeltaNet norms");
    clock.mark(deltanet_conv);
    check(kernels::deltanet_scan(d.ssm_state, qkv, int(c.conv_channels()), b, alpha, d.a, d.dt_bias, int(c.ssm_groups),
                                 int(c.ssm_dt_rank), int(c.ssm_state), int(c.ssm_state), int(n), o, stream),
          "prompt DeltaNet scan");
    check(kernels::gated_norm_rows(o, z, d.norm, int(n * c.ssm_dt_rank), int(c.ssm_state), float(c.rms_eps), stream),
          "prompt DeltaNet norm");
    clock.mark(deltanet_core);
    project(d.out, o, n, mixed);
  }

  // Products of the experts that have tokens: y rows [first[e], first[e] + counts[e]) =
  // x rows of the same range times expert e's matrix (expanded, `stride` floats apart) transposed.
  // One grouped launch where cuBLAS offers it, else one product per expert.
  void per_expert(const float* x, int64_t ldx, const float* matrices, int64_t stride, float* y, int64_t ldy,
                  int64_t n_out, int64_t k) {
    if (grouped_supported) {
      std::vector<int> rows;
      for (int64_t e = 0; e < config.n_experts; ++e)
        if (host_counts[e] > 0) rows.push_back(host_counts[e]);
      check(kernels::grouped_pointers(counts, first, int(config.n_experts), x, ldx, matrices, stride, y, ldy,
                                      pointer_w, pointer_x, pointer_y, stream),
            "grouped product pointers");
      grouped_supported = gemm.xwt_grouped(rows, n_out, k, pointer_w, k, pointer_x, ldx, pointer_y, ldy);
      if (grouped_supported) {
        clock.mark(expert_products);
        return;
      }
    }
    for (int64_t e = 0; e < config.n_experts; ++e) {
      const int64_t count = host_counts[e], at = host_first[e];
      if (count > 0) gemm.xwt(x + at * ldx, ldx, matrices + e * stride, k, y + at * ldy, ldy, count, n_out, k);
    }
    clock.mark(expert_products);
  }

  // Products without an expansion kernel: one matrix-vector product per sorted row.
  void per_row(const DeviceExperts& e, const float* x, int64_t ldx, float* y, int64_t rows) {
    for (int64_t p = 0; p < rows; p += kMaxMatvecProblems) {
      const int64_t count = std::min(kMaxMatvecProblems, rows - p);
      grouped_matvec(e.type, e.table, expert_of + p, count, e.rows, e.cols, e.row_bytes, x + p * ldx, ldx,
                     y + p * e.rows, stream);
    }
  }

  void experts_gate_up(const DeviceLayer& d, int64_t rows) {
    const model::Qwen35MoeConfig& c = config;
    const int64_t ff = c.expert_ff, hidden = c.hidden, n = c.n_experts;
    if (d.gate_up.table && expandable(d.gate_up.type, hidden)) {
      check(dequantize(d.gate_up.type, nullptr, d.gate_up.table, gate_up_order, 2 * n, ff, hidden, d.gate_up.row_bytes,
                       expanded, stream),
            "expanding gate|up experts");
      clock.mark(expand);
      per_expert(xs, hidden, expanded, 2 * ff * hidden, gu, 2 * ff, 2 * ff, hidden);
    } else if (expandable(d.gate.type, hidden) && expandable(d.up.type, hidden)) {
      for (const auto& [experts, half] : {std::pair{&d.gate, 0}, std::pair{&d.up, 1}}) {
        check(dequantize(experts->type, nullptr, experts->table, nullptr, n, ff, hidden, experts->row_bytes, expanded,
                         stream),
              "expanding experts");
        clock.mark(expand);
        per_expert(xs, hidden, expanded, ff * hidden, gu + half * ff, 2 * ff, ff, hidden);
      }
    } else {
      per_row(d.gate, xs, hidden, ys, rows);
      per_row(d.up, xs, hidden, ys + rows * ff, rows);
      clock.mark(expert_products);
      check(kernels::swiglu(ys, ys + rows * ff, act, rows * ff, stream), "expert swiglu");
      return;
    }
    check(kernels::swiglu_rows(gu, int(rows), int(ff), act, stream), "expert swiglu");
    clock.mark(elementwise);
  }

  void moe(const DeviceLayer& d, int64_t n) {
    const model::Qwen35MoeConfig& c = config;
    const int64_t k = c.n_experts_used, rows = n * k, ff = c.expert_ff, hidden = c.hidden;
    project(d.router, normed, n, router, true);
    check(kernels::moe_route(router, int(c.n_experts), int(k), int(n), ids, weights, stream), "prompt router");
    check(kernels::group_by_expert(ids, int(n), int(k), int(c.n_experts), sorted, slot_of, expert_of, counts, first,
                                   hist, stream),
          "grouping by expert");
    check_cuda(cudaMemcpyAsync(host_counts, counts, size_t(c.n_experts) * 4, cudaMemcpyDeviceToHost, stream),
               "expert counts to the host");
    check_cuda(cudaMemcpyAsync(host_first, first, size_t(c.n_experts) * 4, cudaMemcpyDeviceToHost, stream),
               "expert offsets to the host");
    check(kernels::gather_rows(normed, sorted, int(k), int(rows), int(hidden), xs, stream), "gathering expert inputs");
    check_cuda(cudaStreamSynchronize(stream), "routing a prompt chunk");
    clock.mark(routing);
    experts_gate_up(d, rows);
    if (expandable(d.down.type, ff)) {
      check(dequantize(d.down.type, nullptr, d.down.table, nullptr, c.n_experts, hidden, ff, d.down.row_bytes, expanded,
                       stream),
            "expanding down experts");
      clock.mark(expand);
      per_expert(act, ff, expanded, hidden * ff, ys, hidden, hidden, ff);
    } else {
      per_row(d.down, act, ff, ys, rows);
    }
    const bool shared = c.shared_ff > 0;
    if (shared) {
      project(d.shared_gate, normed, n, sg), project(d.shared_up, normed, n, su);
      check(kernels::swiglu(sg, su, sh, n * c.shared_ff, stream), "shared swiglu");
      project(d.shared_down, sh, n, shared_out);
      project(d.shared_logit, normed, n, shared_logit, true);
    }
    check(kernels::moe_combine_rows(ys, slot_of, weights, int(k), shared ? shared_out : nullptr, shared_logit, int(n),
                                    int(hidden), mixed, stream),
          "prompt expert sum");
    clock.mark(elementwise);
  }

  void run(int64_t n, const int64_t* device_first, int64_t first_position) {
    const model::Qwen35MoeConfig& c = config;
    const float eps = float(c.rms_eps);
    const int hidden = int(c.hidden);
    clock.start();
    check(kernels::rms_norm(h, layers.front().attn_norm, normed, int(n), hidden, eps, stream), "prompt norm");
    for (size_t l = 0; l < layers.size(); ++l) {
      const DeviceLayer& d = layers[l];
      d.recurrent ? deltanet(d, n) : attention(d, n, device_first, first_position);
      check(kernels::add_rms_norm(h, mixed, d.post_norm, normed, int(n), hidden, eps, stream), "prompt residual");
      moe(d, n);
      const float* next_norm = l + 1 < layers.size() ? layers[l + 1].attn_norm : output_norm;
      check(kernels::add_rms_norm(h, mixed, next_norm, normed, int(n), hidden, eps, stream), "prompt residual");
    }
    clock.mark(elementwise);
  }
};

PromptPass::PromptPass(const model::Qwen35MoeConfig& config, const std::vector<DeviceLayer>& layers,
                       const float* output_norm, VramAccountant& vram, PromptPassOptions options, void* stream)
    : impl_(std::make_unique<Impl>(config, layers, output_norm, vram, options, stream)) {
  if (options.chunk <= 0 || options.chunk > 65535)
    fail("cuda prompt pass: a chunk of {} tokens; it must hold 1 to 65535", options.chunk);
  impl_->allocate_scratch();
}

PromptPass::~PromptPass() = default;

float* PromptPass::input_rows() { return impl_->h; }

void PromptPass::run(int64_t n, const int64_t* device_first, int64_t first) {
  if (n <= 0 || n > impl_->options.chunk) fail("cuda prompt pass: {} tokens for a chunk of {}", n, impl_->options.chunk);
  impl_->run(n, device_first, first);
}

const float* PromptPass::output_rows() const { return impl_->normed; }
int64_t PromptPass::chunk() const { return impl_->options.chunk; }
std::vector<std::pair<std::string, double>> PromptPass::profile() const { return impl_->clock.totals(); }

}  // namespace lode::cuda
