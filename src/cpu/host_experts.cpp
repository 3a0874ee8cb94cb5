#include "cpu/host_experts.h"

#include <algorithm>

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

HostExperts::HostExperts(const model::ModelWeights& weights, int threads)
    : weights_(weights),
      hidden_(weights.config.hidden),
      ff_(weights.config.expert_ff),
      max_experts_(weights.config.n_experts_used),
      pool_(std::max(threads, 1)),
      gate_x_(hidden_),
      up_x_(hidden_),
      gu_(size_t(max_experts_ * 2 * ff_)),
      gate_up_left_(size_t(max_experts_)),
      down_ready_(size_t(max_experts_)) {
  if (const std::string why = unsupported(weights); !why.empty()) fail("the CPU miss path cannot run this model: {}", why);
  for (int64_t i = 0; i < max_experts_; ++i) down_x_.emplace_back(ff_);
}

void HostExperts::compute(int64_t layer, const int32_t* experts, int n, const float* x, float* y) {
  if (n <= 0) return;
  if (n > max_experts_) fail("host experts: {} experts for one token; at most {}", n, max_experts_);
  const model::MoeWeights& m = weights_.layers[size_t(layer)].moe;
  const GgmlType gate_type = m.gate.first.type->type, up_type = m.up.first.type->type;
  const GgmlType down_type = m.down.first.type->type;
  const q8twin::RoundedX& gate_x = gate_x_.x();
  const q8twin::RoundedX& up_x = up_type == gate_type ? gate_x : up_x_.x();
  q8twin::round(gate_type, x, nullptr, hidden_, gate_x);
  if (up_type != gate_type) q8twin::round(up_type, x, nullptr, hidden_, up_x);

  // One parallel loop: the gate and up products (per expert, tasks of rows of the gate then of the
  // up matrix), then the down products. Whoever finishes an expert's last gate/up task rounds its
  // SwiGLU for the down weights and flags it; down tasks wait for their expert's flag. Tasks are
  // claimed in order, so every gate/up task is taken before a down task waits, and no barrier
  // between the phases is needed (each costs microseconds, 40 times a step).
  const int64_t ff_tasks = tasks_for(ff_), hidden_tasks = tasks_for(hidden_), gate_up_tasks = int64_t(n) * 2 * ff_tasks;
  for (int i = 0; i < n; ++i) {
    gate_up_left_[size_t(i)].store(int(2 * ff_tasks), std::memory_order_relaxed);
    down_ready_[size_t(i)].store(0, std::memory_order_relaxed);
  }
  pool_.run(gate_up_tasks + int64_t(n) * hidden_tasks, [&](int64_t t) {
    if (t < gate_up_tasks) {
      const int i = int(t / (2 * ff_tasks)), which = int(t / ff_tasks % 2);
      const int64_t first = t % ff_tasks * kRowsPerTask, rows = std::min(kRowsPerTask, ff_ - first);
      const model::MatrixView w = (which ? m.up : m.gate).expert(experts[i]);
      float* g = gu_.data() + int64_t(i) * 2 * ff_;
      q8twin::rows(w.type->type, w.row(first), w.row_bytes, rows, w.cols, which ? up_x : gate_x, g + which * ff_ + first);
      if (gate_up_left_[size_t(i)].fetch_sub(1, std::memory_order_acq_rel) == 1) {
        q8twin::round(down_type, g, g + ff_, ff_, down_x_[size_t(i)].x());
        down_ready_[size_t(i)].store(1, std::memory_order_release);
      }
      return;
    }
    const int64_t d = t - gate_up_tasks;
    const int i = int(d / hidden_tasks);
    const int64_t first = d % hidden_tasks * kRowsPerTask, rows = std::min(kRowsPerTask, hidden_ - first);
    while (!down_ready_[size_t(i)].load(std::memory_order_acquire)) spin_pause();
    const model::MatrixView w = m.down.expert(experts[i]);
    q8twin::rows(w.type->type, w.row(first), w.row_bytes, rows, w.cols, down_x_[size_t(i)].x(), y + int64_t(i) * hidden_ + first);
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
