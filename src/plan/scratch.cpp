#include "plan/scratch.h"

#include <algorithm>

#include "sample/sampler.h"

namespace lode::plan {

namespace {
constexpr size_t kAlign = 256;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Attention scores of one block of prompt queries are [heads][queries][keys] floats: room for an
// eighth of the chunk's queries over the whole context, at most 256 MiB (at least one query).
int64_t score_bytes(const model::Qwen35MoeConfig& c, int64_t chunk, int64_t max_context) {
  return std::min<int64_t>(int64_t(256) << 20, c.n_heads * std::max<int64_t>(chunk / 8, 1) * max_context * 4);
}

// Whether the prompt pass expands a dense matrix to float32 before its product: quantized ones
// (float32 ones are multiplied where they are; experts are read from their stored bytes). Matrices
// of a type the GPU cannot expand (the grid i-quants) are counted too; their room goes unused.
bool expanded_for_prompts(const model::MatrixView& m) {
  return !m.empty() && m.type->type != GgmlType::F32 && m.cols % 32 == 0;
}
}  // namespace

size_t Layout::take(size_t bytes) {
  const size_t at = end_;
  end_ = aligned(end_ + bytes);
  if (in_union_) union_end_ = std::max(union_end_, end_);
  return at;
}

void Layout::begin_union() {
  in_union_ = true;
  union_begin_ = union_end_ = end_;
}

void Layout::alternative() { end_ = union_begin_; }

void Layout::end_union() {
  in_union_ = false;
  end_ = union_end_;
}

size_t rounded_input_bytes(int64_t cols) {
  const size_t blocks = size_t(cols + 31) / 32;  // each 32 values: 34 bytes at most, a scale, two sums of 16
  return (blocks * (34 + 4 + 8) + 15) / 16 * 16;
}

int attention_splits(int64_t max_context) { return int(std::clamp<int64_t>(max_context / 256, 1, 256)); }

int top_candidate_slices(int64_t vocab) {
  return int(std::clamp<int64_t>(vocab / 1024, 1, 64));
}

DecodeScratch decode_scratch(const model::Qwen35MoeConfig& c, int64_t max_context, int64_t rows, bool mtp) {
  const int64_t k = c.n_experts_used, n = std::max<int64_t>(rows, 1);
  Layout l;
  DecodeScratch s{};
  s.rows = n;
  // A step's inputs first, in the order one copy from the host writes them.
  s.sequences = l.take(size_t(n) * 4), s.positions = l.take(size_t(n) * 8);
  s.h = l.floats(n * c.hidden), s.normed = l.floats(n * c.hidden), s.mixed = l.floats(n * c.hidden);
  s.attention_partials = l.floats(n * c.n_heads * attention_splits(max_context) * (c.head_dim + 2));
  s.qg = l.floats(n * (2 * c.q_dim() + 2 * c.kv_dim()));
  s.attn = l.floats(n * c.q_dim());
  s.qkv = l.floats(n * (c.conv_channels() + c.ssm_value_dim() + 2 * c.ssm_dt_rank));
  s.o = l.floats(n * c.ssm_value_dim());
  s.router_logits = l.floats(n * (c.n_experts + 1));
  s.weights = l.floats(n * k);
  s.ids = l.take(size_t(n * 2 * k) * 4);
  s.expert_groups = l.take(size_t(n * k) * kExpertGroupBytes);
  s.gu = l.floats(n * 2 * k * c.expert_ff);
  s.y = l.floats(n * k * c.hidden);
  s.shared_gu = l.floats(n * 2 * c.shared_ff);
  s.pair_ids = l.take(size_t(2 * n) * 4);
  s.shared_out = l.floats(n * c.hidden);
  s.logits = l.floats(n * c.vocab);
  s.router_arrivals = l.take(size_t(n) * 4);
  s.route_counts = l.take(size_t(c.n_layers * c.n_experts) * 4);
  s.route_misses = l.take(size_t(4 * c.n_layers) * 4);
  s.miss_path = l.take(kMissPathScratch);
  s.hint_normed = l.floats(c.hidden), s.hint_logits = l.floats(c.n_experts + 1), s.hint_weights = l.floats(k);
  s.hint_ids = l.take(size_t(2 * k) * 4), s.hint_arrivals = l.take(4);
  s.stage_table = l.take(size_t(3 * k) * 8), s.stage_ids = l.take(size_t(2 * k) * 4);
  s.stage_copies = l.take(size_t(1 + k) * 4);
  s.greedy_partials = l.take(size_t(n * kGreedyBlocks) * 8), s.greedy_token = l.take(size_t(n) * 4);
  s.greedy_arrivals = l.take(size_t(n) * 4);
  const size_t slices = size_t(top_candidate_slices(c.vocab));
  s.top_pairs = l.take(size_t(n) * slices * sample::kTopCandidates * 8);
  s.top_counts = l.take(size_t(n) * slices * 2 * 4);
  s.top_aside = l.take(size_t(n) * (1 + sample::kTopAsideMost) * 4);
  s.top_aside_logits = l.floats(n * sample::kTopAsideMost);
  if (mtp)
    s.mtp_rows = l.floats(n * 2 * c.hidden), s.mtp_shifts = l.take(size_t(n) * 8),
    s.mtp_armed = l.floats((n + 1) * c.hidden), s.mtp_continue = l.take(2 * 4);
  if (n > 1) {  // several rows' inputs rounded once per product: each row's, or each (row, slot) pair's
    const int64_t widest = std::max({c.hidden, c.q_dim(), c.ssm_value_dim(), c.shared_ff});
    s.rounded_x = l.take(std::max(size_t(n) * rounded_input_bytes(widest), size_t(n * k) * rounded_input_bytes(c.expert_ff)));
    s.rounded_x_bytes = l.total() - s.rounded_x;
    s.rounded_x_side = l.take(size_t(n) * rounded_input_bytes(std::max(c.hidden, c.shared_ff)));
    s.rounded_x_side_bytes = l.total() - s.rounded_x_side;
  }
  s.total = l.total();
  return s;
}

namespace {

// The most floats one expansion needs: the largest quantized dense matrix.
int64_t expansion_floats(const model::ModelWeights& w) {
  int64_t most = 0;
  const auto dense = [&](const model::MatrixView& m) {
    if (expanded_for_prompts(m)) most = std::max(most, m.rows * m.cols);
  };
  for (const model::LayerWeights& l : w.layers) {
    const model::AttentionWeights& a = l.attention;
    const model::DeltaNetWeights& d = l.deltanet;
    const model::MoeWeights& m = l.moe;
    for (const model::MatrixView* v : {&a.q, &a.k, &a.v, &a.output, &d.qkv, &d.gate, &d.beta, &d.alpha, &d.out,
                                       &m.router, &m.shared_gate, &m.shared_up, &m.shared_down})
      dense(*v);
  }
  return most;
}

// One staging buffer: a group of experts' gate and up, or their down, in the largest layer's pieces.
size_t staging_bytes(const model::ModelWeights& w) {
  size_t most = 0;
  for (const model::LayerWeights& l : w.layers) {
    const StagingPieces p = staging_pieces(l.moe);
    most = std::max({most, p.gate_up, p.down});
  }
  return size_t(std::min(kPromptExpertGroup, w.config.n_experts)) * most;
}

}  // namespace

StagingPieces staging_pieces(const model::MoeWeights& m) {
  const auto bytes = [](const model::ExpertStack& s) { return (size_t(s.first.rows) * s.first.row_bytes + 255) / 256 * 256; };
  return {.up_at = bytes(m.gate), .gate_up = bytes(m.gate) + bytes(m.up), .down = bytes(m.down)};
}

PromptScratch prompt_scratch(const model::ModelWeights& w, int64_t chunk, int64_t max_context) {
  const model::Qwen35MoeConfig& c = w.config;
  const int64_t n = chunk, k = c.n_experts_used, rows = n * k;
  Layout l;
  PromptScratch s{};
  s.chunk = chunk;
  s.h = l.floats(n * c.hidden), s.normed = l.floats(n * c.hidden), s.mixed = l.floats(n * c.hidden);
  s.expanded = l.floats(expansion_floats(w));
  s.expert_pointers = l.take(size_t(3 * c.n_experts) * 8);
  l.begin_union();
  s.qg = l.floats(n * 2 * c.q_dim()), s.kbuf = l.floats(n * c.kv_dim()), s.vbuf = l.floats(n * c.kv_dim());
  s.attn = l.floats(n * c.q_dim());
  s.k_rows = l.floats(max_context * c.kv_dim()), s.v_rows = l.floats(max_context * c.kv_dim());
  const int64_t score_row = c.n_heads * max_context * 4;
  s.score_floats =
      c.n_heads * std::clamp<int64_t>(score_bytes(c, n, max_context) / std::max<int64_t>(score_row, 1), 1, n) * max_context;
  s.scores = l.floats(s.score_floats);
  l.alternative();
  s.qkv_raw = l.floats(n * c.conv_channels()), s.qkv = l.floats(n * c.conv_channels());
  s.z = l.floats(n * c.ssm_value_dim()), s.b = l.floats(n * c.ssm_dt_rank), s.alpha = l.floats(n * c.ssm_dt_rank);
  s.o = l.floats(n * c.ssm_value_dim());
  const size_t mixers_end = l.union_end();
  l.alternative();
  s.router = l.floats(n * c.n_experts), s.weights = l.floats(rows);
  s.ids = l.take(size_t(2 * rows) * 4), s.sorted = l.take(size_t(rows) * 4), s.slot_of = l.take(size_t(rows) * 4);
  s.expert_of = l.take(size_t(rows) * 4), s.counts = l.take(size_t(c.n_experts) * 4);
  s.first = l.take(size_t(c.n_experts) * 4), s.hist = l.take(size_t(32 * c.n_experts) * 4);
  s.expert_tiles_count = size_t(rows / kPromptExpertTileRows + c.n_experts);
  s.expert_tiles = l.take(s.expert_tiles_count * 16);
  s.xs = l.floats(rows * c.hidden), s.gu = l.floats(rows * 2 * c.expert_ff), s.act = l.floats(rows * c.expert_ff);
  s.ys = l.floats(rows * std::max(c.hidden, 2 * c.expert_ff));
  s.sg = l.floats(n * c.shared_ff), s.su = l.floats(n * c.shared_ff), s.sh = l.floats(n * c.shared_ff);
  s.shared_out = l.floats(n * c.hidden), s.shared_logit = l.floats(n);
  s.staging_bytes = staging_bytes(w);
  s.staging = l.take(2 * s.staging_bytes);
  s.staging_apart = s.staging >= mixers_end;
  l.end_union();
  s.total = l.total();
  return s;
}

}  // namespace lode::plan
