#include "plan/gpu_split.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace lode::plan {

namespace {

double mib(size_t bytes) { return double(bytes) / double(1 << 20); }

// What one layer puts on its GPU besides experts, for every sequence: its trunk, and its K/V
// cells (attention) or its DeltaNet states.
struct LayerBytes {
  size_t trunk = 0, kv = 0, states = 0;
  bool attention = false;
  size_t total() const { return trunk + kv + states; }
};

std::vector<LayerBytes> layer_bytes(const model::ModelWeights& w, const PlanOptions& o) {
  const size_t sequences = size_t(std::max<int64_t>(o.parallel, 1));
  std::vector<LayerBytes> out;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerBytes b{.trunk = layer_trunk_bytes(w, l), .attention = !w.layers[l].recurrent};
    if (b.attention)  // (a shared pool's positions, or every sequence's whole context)
      b.kv = o.kv_positions > 0 ? kv_layer_bytes(w.config, o.kv, o.kv_positions)
                                : sequences * kv_layer_bytes(w.config, o.kv, o.context);
    else b.states = state_layer_bytes(w.config, o.kept_rows(), int64_t(sequences));
    out.push_back(b);
  }
  return out;
}

// Experts in the order they are wanted: by score (highest first), or with no scores the first
// expert of every layer, then the second of every layer, ... (an even spread); ties by layer, expert.
std::vector<int64_t> wanted_order(int64_t n_layers, int64_t n_experts, std::span<const double> scores) {
  std::vector<int64_t> order(size_t(n_layers * n_experts));
  std::iota(order.begin(), order.end(), 0);
  const auto key = [&](int64_t i) {
    return scores.empty() ? double(-(i % n_experts)) : scores[size_t(i)];  // higher first
  };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key(a) > key(b); });
  return order;
}

// Experts in the order they are wanted, each on its own layer's GPU while that has room, else on
// the GPU with the most room left that its layer's GPU can read, until no GPU can take more.
void place_experts(GpuSplit& split, int64_t n_experts, std::span<const double> scores, int64_t cap,
                   std::span<const uint8_t> reachable) {
  const int64_t n_layers = split.experts_total / std::max<int64_t>(n_experts, 1);
  std::vector<int64_t> room;
  for (const GpuShare& g : split.gpus)
    room.push_back(split.slot_bytes > 0 && g.budget > g.fixed() ? int64_t((g.budget - g.fixed()) / split.slot_bytes) : 0);
  std::vector<size_t> home(size_t(n_layers), 0);  // each layer's GPU
  for (size_t g = 0; g < split.gpus.size(); ++g)
    for (int64_t l = split.gpus[g].first_layer; l < split.gpus[g].end_layer; ++l) home[size_t(l)] = g;
  split.owner.assign(size_t(split.experts_total), -1);
  int64_t left = std::accumulate(room.begin(), room.end(), int64_t(0));
  if (cap >= 0) left = std::min(left, cap);
  const size_t n_gpus = split.gpus.size();
  const auto can_hold = [&](size_t reader, size_t holder) {
    return reader == holder || reachable.empty() || reachable[reader * n_gpus + holder];
  };
  for (const int64_t i : wanted_order(n_layers, n_experts, scores)) {
    if (left == 0) break;
    const size_t at_home = home[size_t(i / n_experts)];
    size_t g = at_home;
    if (room[g] == 0)
      for (size_t h = 0; h < n_gpus; ++h)
        if (can_hold(at_home, h) && room[h] > room[g]) g = h;
    if (room[g] == 0) continue;  // (no GPU its layer's GPU can read has room)
    split.owner[size_t(i)] = int32_t(g);
    --room[g], --left;
    ++split.gpus[g].experts;
  }
}

}  // namespace

int64_t GpuSplit::experts_resident() const {
  int64_t n = 0;
  for (const GpuShare& g : gpus) n += g.experts;
  return n;
}

LayerCut cut_layers(std::span<const size_t> costs, std::span<const double> room) {
  const size_t n_layers = costs.size(), n_gpus = room.size();
  std::vector<double> running(n_layers + 1, 0.0);  // running[e]: the cost of layers [0, e)
  for (size_t l = 0; l < n_layers; ++l) running[l + 1] = running[l] + double(costs[l]);
  // best[g][e]: the smallest largest share of its room any GPU carries when GPUs [0, g) take
  // layers [0, e), each at least one; from[g][e]: where GPU g - 1's range then starts.
  const double none = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(n_gpus + 1, std::vector<double>(n_layers + 1, none));
  std::vector<std::vector<size_t>> from(n_gpus + 1, std::vector<size_t>(n_layers + 1, 0));
  best[0][0] = 0.0;
  for (size_t g = 0; g < n_gpus; ++g) {
    const double space = std::max(room[g], 1.0);  // no room: one byte
    for (size_t e = g + 1; e + (n_gpus - 1 - g) <= n_layers; ++e)
      for (size_t start = g; start < e; ++start) {
        if (best[g][start] == none) continue;
        const double load = std::max(best[g][start], (running[e] - running[start]) / space);
        if (load < best[g + 1][e]) best[g + 1][e] = load, from[g + 1][e] = start;
      }
  }
  LayerCut cut{std::vector<int64_t>(n_gpus), best[n_gpus][n_layers]};
  for (size_t g = n_gpus, e = n_layers; g > 0; e = from[g][e], --g) cut.ends[g - 1] = int64_t(e);
  return cut;
}

namespace {

// Each GPU's share for `ends` at a prompt chunk.
// (Each GPU's figures are plan_memory's for its share of the layers: share_options.)
std::vector<GpuShare> shares(const std::vector<LayerBytes>& layers, size_t head, size_t hand_on, size_t page_table,
                             std::span<const size_t> budgets, const std::vector<int64_t>& ends, size_t scratch) {
  std::vector<GpuShare> out;
  int64_t start = 0;
  for (size_t g = 0; g < ends.size(); ++g) {
    GpuShare s{.budget = budgets[g], .first_layer = start, .end_layer = ends[g], .scratch = scratch};
    for (int64_t l = start; l < s.end_layer; ++l) {
      const LayerBytes& b = layers[size_t(l)];
      s.trunk += b.trunk, s.kv += b.kv, s.states += b.states;
    }
    s.kv += page_table;  // each GPU's cache has its tables
    s.trunk += g + 1 == ends.size() ? head : hand_on;
    out.push_back(s);
    start = s.end_layer;
  }
  return out;
}

// Fails for the GPU the cut leaves shortest, saying what it holds and what would help.
[[noreturn]] void refuse(const std::vector<GpuShare>& gpus, const PlanOptions& o, int64_t chunk, size_t head) {
  size_t worst = 0;
  for (size_t g = 1; g < gpus.size(); ++g)
    if (int64_t(gpus[g].fixed() - gpus[g].budget) > int64_t(gpus[worst].fixed() - gpus[worst].budget)) worst = g;
  const GpuShare& s = gpus[worst];
  const bool layers_are_the_problem = s.scratch + (worst + 1 == gpus.size() ? head : 0) < s.budget;
  fail_budget("GPU {}: a VRAM budget of {:.1f} MiB cannot hold layers {}-{} (trunk {:.1f} MiB, K/V {:.1f} MiB for {} positions "
       "in {}, DeltaNet states {:.1f} MiB) and its scratch for prompt chunks of {} ({:.1f} MiB): short by {:.1f} MiB; "
       "raise --vram-budget or give a smaller --ctx{}",
       worst, mib(s.budget), s.first_layer, s.end_layer - 1, mib(s.trunk), mib(s.kv), o.context, kv::to_string(o.kv),
       mib(s.states), chunk, mib(s.scratch), mib(s.fixed() - s.budget), layers_are_the_problem ? ", or use more GPUs" : "");
}

}  // namespace

GpuSplit split_over_gpus(const model::ModelWeights& w, const PlanOptions& o, std::span<const size_t> budgets,
                         std::span<const double> scores, std::span<const uint8_t> reachable) {
  const model::Qwen35MoeConfig& c = w.config;
  const int64_t n_gpus = int64_t(budgets.size()), n_layers = int64_t(w.layers.size());
  if (n_gpus < 1) fail("memory plan: at least one GPU");
  if (n_gpus > n_layers) fail("memory plan: {} GPUs for {} layers; each GPU takes at least one layer", n_gpus, n_layers);
  if (o.context <= 0) fail("memory plan: the context must be positive");
  if (!scores.empty() && int64_t(scores.size()) != n_layers * c.n_experts)
    fail("memory plan: {} expert scores for {} layers of {} experts", scores.size(), n_layers, c.n_experts);
  for (double score : scores)
    if (!std::isfinite(score)) fail("memory plan: an expert score is not a finite number");
  if (!reachable.empty() && int64_t(reachable.size()) != n_gpus * n_gpus)
    fail("memory plan: {} entries of which GPU reads which for {} GPUs", reachable.size(), n_gpus);
  // The last GPU's own: the output norm and the lm head, and with o.mtp the MTP block (it drafts
  // from the last layer's hidden states through the lm head) and its K/V cache of every sequence.
  const size_t head = head_bytes(w) + (o.mtp ? mtp_trunk_bytes(w) : 0);
  const size_t head_kv = o.mtp ? size_t(std::max<int64_t>(o.parallel, 1)) * mtp_kv_bytes(w.config, o.kv, o.context) : 0;
  const size_t page_table = size_t(std::max<int64_t>(o.parallel, 1)) * kv_page_table_bytes(o.context);
  const std::vector<LayerBytes> layers = layer_bytes(w, o);
  std::vector<size_t> costs;
  for (const LayerBytes& b : layers) costs.push_back(b.total());
  // The prompt chunk halves while the GPUs cannot hold it, as on one GPU (plan_memory).
  int64_t chunk = o.prompt_chunk > 0 ? std::min(o.prompt_chunk, o.context) : 0;
  const int64_t smallest = o.prompt_chunk > 0 ? std::min({o.prompt_chunk, kMinPromptChunk, o.context}) : 0;
  for (;;) {
    const size_t scratch =
        decode_scratch(c, o.context, o.step_rows, o.mtp).total + (chunk > 0 ? prompt_scratch(w, chunk, o.context).total : 0);
    std::vector<double> room;
    for (int64_t g = 0; g < n_gpus; ++g) {
      const double held = double(scratch + (g + 1 == n_gpus ? head + head_kv : 0));
      room.push_back(std::max(double(budgets[size_t(g)]) - held, 0.0));
    }
    const LayerCut cut = cut_layers(costs, room);
    std::vector<GpuShare> gpus = shares(layers, head, hand_on_bytes(c), page_table, budgets, cut.ends, scratch);
    gpus.back().kv += head_kv;
    const bool fits = std::all_of(gpus.begin(), gpus.end(), [](const GpuShare& s) { return s.fixed() <= s.budget; });
    if (!fits && chunk > smallest) {
      chunk = std::max(chunk / 2, smallest);
      continue;
    }
    if (!fits) refuse(gpus, o, chunk, head);
    GpuSplit split;
    split.gpus = std::move(gpus);
    split.prompt_chunk = chunk;
    for (const ExpertBytes& e : expert_bytes(w))
      split.slot_bytes = std::max(split.slot_bytes, (e.total() + 255) / 256 * 256);
    split.experts_total = n_layers * c.n_experts;
    place_experts(split, c.n_experts, scores, o.max_resident_experts, reachable);
    return split;
  }
}

PlanOptions share_options(const GpuSplit& split, const PlanOptions& options, size_t gpu) {
  PlanOptions o = options;
  o.budget = split.gpus[gpu].budget;
  o.prompt_chunk = split.prompt_chunk;
  o.head = gpu + 1 == split.gpus.size();
  o.mtp = options.mtp && o.head;  // (the MTP block goes with the lm head)
  return o;
}

std::string describe(const GpuSplit& split) {
  std::string out;
  const int64_t n_experts = split.experts_total / std::max<int64_t>(split.gpus.back().end_layer, 1);
  for (size_t g = 0; g < split.gpus.size(); ++g) {
    const GpuShare& s = split.gpus[g];
    int64_t lent = 0;  // of its experts, those of other GPUs' layers
    for (size_t i = 0; i < split.owner.size(); ++i) {
      const int64_t layer = int64_t(i) / std::max<int64_t>(n_experts, 1);
      lent += split.owner[i] == int32_t(g) && (layer < s.first_layer || layer >= s.end_layer);
    }
    out += fmt::format("GPU {}: budget {:.1f} MiB: layers {}-{}, trunk {:.1f}, K/V {:.1f}, DeltaNet states {:.1f}, "
                       "scratch {:.1f} (prompt chunks of {}), experts {} ({:.1f} MiB){}\n",
                       g, mib(s.budget), s.first_layer, s.end_layer - 1, mib(s.trunk), mib(s.kv), mib(s.states),
                       mib(s.scratch), split.prompt_chunk, s.experts, mib(size_t(s.experts) * split.slot_bytes),
                       lent ? fmt::format(", {} of them of other GPUs' layers", lent) : std::string());
  }
  out += fmt::format("experts in VRAM: {} of {} ({:.1f}%), none on two GPUs\n", split.experts_resident(),
                     split.experts_total,
                     100.0 * double(split.experts_resident()) / double(std::max<int64_t>(split.experts_total, 1)));
  return out;
}

}  // namespace lode::plan
