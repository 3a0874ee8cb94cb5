#include "cpu/host_experts.h"

#include <algorithm>
#include <bit>

#include "core/error.h"
#include "cpu/q8_twin.h"

namespace lode::cpu {

namespace {

// Rows per task: small enough that 16 threads share a layer's few experts evenly, large enough
// that claiming a task costs nothing next to it (64 Q4_K rows of 2048 values are 72 KiB).
constexpr int64_t kRowsPerTask = 64;

int64_t tasks_for(int64_t rows) { return (rows + kRowsPerTask - 1) / kRowsPerTask; }

// Bytes per prefetch piece: a few pieces per thread for one expert (Q4_K gate and up of 512 x 2048
// are 576 KiB each), so that a piece is never the last one for long when the request comes.
constexpr int64_t kPrefetchPiece = 64 << 10;

int64_t pieces_of(const model::MatrixView& w) { return (w.rows * int64_t(w.row_bytes) + kPrefetchPiece - 1) / kPrefetchPiece; }

// One load per cache line brings the line in (the hardware prefetchers run ahead of a stream of
// them); volatile, so that the compiler keeps loads whose values nobody uses.
void touch(const uint8_t* p, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) (void)*reinterpret_cast<const volatile uint8_t*>(p + at);
  (void)*reinterpret_cast<const volatile uint8_t*>(p + bytes - 1);
}

}  // namespace

std::string HostExperts::unsupported(const model::ModelWeights& weights) {
  for (const model::LayerWeights& layer : weights.layers) {
    const model::MoeWeights& m = layer.moe;
    for (const model::ExpertStack* s : {&m.gate, &m.up, &m.down})
      if (!q8twin::has_twin(s->first.type->type))
        return fmt::format("its experts are {} (the CPU miss path computes Q8_0, Q5_0, Q4_K, Q5_K and Q6_K)",
                           s->first.type->name);
  }
  return "";
}

HostExperts::HostExperts(const model::ModelWeights& weights, int threads, int most_pairs, int most_rows)
    : weights_(weights),
      hidden_(weights.config.hidden),
      ff_(weights.config.expert_ff),
      most_pairs_(std::max<int64_t>(most_pairs, weights.config.n_experts_used)),
      most_rows_(std::clamp(most_rows, 1, 64)),
      pool_(std::max(threads, 1)),
      gu_(size_t(most_pairs_ * 2 * ff_)),
      pair_expert_(size_t(most_pairs_)),
      pair_row_(size_t(most_pairs_)),
      used_rows_(size_t(most_rows_)),
      row_ready_(size_t(most_rows_)),
      gate_up_left_(size_t(most_pairs_)),
      down_ready_(size_t(most_pairs_)) {
  if (const std::string why = unsupported(weights); !why.empty()) fail("the CPU miss path cannot run this model: {}", why);
  for (int64_t i = 0; i < most_rows_; ++i) gate_x_.emplace_back(hidden_), up_x_.emplace_back(hidden_);
  for (int64_t i = 0; i < most_pairs_; ++i) down_x_.emplace_back(ff_);
}

void HostExperts::compute(int64_t layer, const int32_t* experts, int n, const float* x, float* y) {
  const int64_t most = std::min<int64_t>(weights_.config.n_experts_used, 64);
  if (n > most) fail("host experts: {} experts for one token; at most {}", n, most);
  uint64_t row0[64];
  std::fill_n(row0, std::max(n, 0), uint64_t(1));
  compute(layer, experts, row0, n, x, y);
}

void HostExperts::compute(int64_t layer, const int32_t* experts, const uint64_t* rows, int n, const float* x, float* y) {
  if (n <= 0) return;
  // The pairs, expert after expert, and the rows they read (row_of: a row's place among them).
  uint64_t all_rows = 0;
  for (int i = 0; i < n; ++i) all_rows |= rows[i];
  int64_t pairs = 0, used = 0;
  int row_of[64];
  for (int r = 0; r < 64; ++r)
    if (all_rows >> r & 1) {
      if (used == most_rows_) fail("host experts: a request reads more than {} rows", most_rows_);
      row_of[r] = int(used), used_rows_[size_t(used++)] = r;
    }
  for (int i = 0; i < n; ++i)
    for (uint64_t m = rows[i]; m; m &= m - 1) {
      if (pairs == most_pairs_) fail("host experts: a request of more than {} (expert, row) pairs", most_pairs_);
      pair_expert_[size_t(pairs)] = experts[i], pair_row_[size_t(pairs++)] = row_of[std::countr_zero(m)];
    }
  const model::MoeWeights& m = weights_.layers[size_t(layer)].moe;
  const GgmlType gate_type = m.gate.first.type->type, up_type = m.up.first.type->type;
  const GgmlType down_type = m.down.first.type->type;
  const auto up_x = [&](int64_t j) -> const q8twin::RoundedX& {
    return up_type == gate_type ? gate_x_[size_t(j)].x() : up_x_[size_t(j)].x();
  };

  // One parallel loop: each row's x rounded, then the gate and up products (per pair, tasks of rows
  // of the gate then of the up matrix), then the down products. Whoever finishes a pair's last
  // gate/up task rounds its SwiGLU for the down weights and flags it; a task waits for the flag of
  // what it reads (its row's rounding, its pair's SwiGLU). Tasks are claimed in order, so what a
  // task waits for has been taken before it, and no barrier between the phases is needed (each
  // costs microseconds, 40 times a step).
  const int64_t ff_tasks = tasks_for(ff_), hidden_tasks = tasks_for(hidden_), gate_up_tasks = pairs * 2 * ff_tasks;
  for (int64_t j = 0; j < used; ++j) row_ready_[size_t(j)].store(0, std::memory_order_relaxed);
  for (int64_t i = 0; i < pairs; ++i) {
    gate_up_left_[size_t(i)].store(int(2 * ff_tasks), std::memory_order_relaxed);
    down_ready_[size_t(i)].store(0, std::memory_order_relaxed);
  }
  pool_.run(used + gate_up_tasks + pairs * hidden_tasks, [&](int64_t t) {
    if (t < used) {
      const float* row = x + int64_t(used_rows_[size_t(t)]) * hidden_;
      q8twin::round(gate_type, row, nullptr, hidden_, gate_x_[size_t(t)].x());
      if (up_type != gate_type) q8twin::round(up_type, row, nullptr, hidden_, up_x_[size_t(t)].x());
      row_ready_[size_t(t)].store(1, std::memory_order_release);
      return;
    }
    if ((t -= used) < gate_up_tasks) {
      const int64_t i = t / (2 * ff_tasks), j = pair_row_[size_t(i)];
      const int which = int(t / ff_tasks % 2);
      const int64_t first = t % ff_tasks * kRowsPerTask, count = std::min(kRowsPerTask, ff_ - first);
      const model::MatrixView w = (which ? m.up : m.gate).expert(pair_expert_[size_t(i)]);
      float* g = gu_.data() + i * 2 * ff_;
      while (!row_ready_[size_t(j)].load(std::memory_order_acquire)) spin_pause();
      q8twin::rows(w.type->type, w.row(first), w.row_bytes, count, w.cols, which ? up_x(j) : gate_x_[size_t(j)].x(),
                   g + which * ff_ + first);
      if (gate_up_left_[size_t(i)].fetch_sub(1, std::memory_order_acq_rel) == 1) {
        q8twin::round(down_type, g, g + ff_, ff_, down_x_[size_t(i)].x());
        down_ready_[size_t(i)].store(1, std::memory_order_release);
      }
      return;
    }
    const int64_t d = t - gate_up_tasks, i = d / hidden_tasks;
    const int64_t first = d % hidden_tasks * kRowsPerTask, count = std::min(kRowsPerTask, hidden_ - first);
    while (!down_ready_[size_t(i)].load(std::memory_order_acquire)) spin_pause();
    const model::MatrixView w = m.down.expert(pair_expert_[size_t(i)]);
    q8twin::rows(w.type->type, w.row(first), w.row_bytes, count, w.cols, down_x_[size_t(i)].x(), y + i * hidden_ + first);
  });
}

HostExperts::PrefetchLayout HostExperts::prefetch_layout(int64_t layer, int n) const {
  const model::MoeWeights& m = weights_.layers[size_t(layer)].moe;
  PrefetchLayout l{.layer = layer, .gate_pieces = pieces_of(m.gate.first), .up_pieces = pieces_of(m.up.first),
                   .down_pieces = pieces_of(m.down.first)};
  l.pieces = int64_t(std::max(n, 0)) * (l.gate_pieces + l.up_pieces + l.down_pieces);
  return l;
}

int64_t HostExperts::prefetch_piece(const PrefetchLayout& l, const int32_t* experts, int64_t piece) const {
  const model::MoeWeights& m = weights_.layers[size_t(l.layer)].moe;
  const int64_t per_expert = l.gate_pieces + l.up_pieces + l.down_pieces;
  const int32_t expert = experts[piece / per_expert];
  int64_t p = piece % per_expert;
  const model::ExpertStack* stack = &m.gate;
  if (p >= l.gate_pieces) {
    p -= l.gate_pieces, stack = &m.up;
    if (p >= l.up_pieces) p -= l.up_pieces, stack = &m.down;
  }
  const model::MatrixView w = stack->expert(expert);
  const int64_t bytes = w.rows * int64_t(w.row_bytes), first = p * kPrefetchPiece;
  const int64_t piece_bytes = std::min(kPrefetchPiece, bytes - first);
  touch(w.data + first, piece_bytes);
  return piece_bytes;
}

}  // namespace lode::cpu
