#include "plan/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "core/error.h"
#include "cuda/weight_types.h"

namespace lode::plan {

namespace {

double mib(size_t bytes) { return double(bytes) / double(1 << 20); }

size_t matrix_bytes(const model::MatrixView& m) { return m.empty() ? 0 : size_t(m.rows) * m.row_bytes; }
size_t vector_bytes(const std::vector<float>& v) { return std::max<size_t>(v.size(), 1) * 4; }

// A layer's trunk as the GPU holds it (layer_trunk_bytes).
size_t layer_bytes_of(const model::Qwen35MoeConfig& c, const model::LayerWeights& l) {
  size_t total = vector_bytes(l.attn_norm) + vector_bytes(l.post_attention_norm);
  if (l.recurrent) {
    const model::DeltaNetWeights& d = l.deltanet;
    total += matrix_bytes(d.qkv) + matrix_bytes(d.gate) + matrix_bytes(d.beta) + matrix_bytes(d.alpha) +
             matrix_bytes(d.out);
    total += vector_bytes(d.conv) + vector_bytes(d.dt_bias) + vector_bytes(d.a) + vector_bytes(d.norm);
  } else {
    const model::AttentionWeights& a = l.attention;
    total += matrix_bytes(a.q) + matrix_bytes(a.k) + matrix_bytes(a.v) + matrix_bytes(a.output);
    total += vector_bytes(a.q_norm) + vector_bytes(a.k_norm);
  }
  const model::MoeWeights& m = l.moe;
  total += matrix_bytes(m.router);
  // The (expert -> gate | up | down) table and the residency flags the routing counts misses by.
  total += size_t(3 * c.n_experts) * sizeof(void*) + size_t(c.n_experts);
  if (c.shared_ff > 0) {
    total += size_t(c.hidden) * 4;  // the shared expert's gate vector
    total += matrix_bytes(m.shared_gate) + matrix_bytes(m.shared_up) + matrix_bytes(m.shared_down);
    if (model::same_shape(m.shared_gate, m.shared_up)) total += 2 * sizeof(void*);  // its gate|up pair table
  }
  return total;
}

size_t floats_bytes(int64_t n) { return size_t(std::max<int64_t>(n, 1)) * 4; }

// Positions of K/V the cache allocates: whole pages of 64 (cuda/kv_format.h's kKvPagePositions).
constexpr int64_t kPagePositions = 64;

// What the budget holds before any expert, at a prompt chunk.
struct Fixed {
  size_t trunk, kv, states, decode, prompt;
  size_t total() const { return trunk + kv + states + decode + prompt; }
};

Fixed fixed_at(const model::ModelWeights& w, const PlanOptions& o, int64_t chunk) {
  const model::Qwen35MoeConfig& c = w.config;
  const int64_t sequences = std::max<int64_t>(o.parallel, 1);
  const size_t mtp_kv = o.mtp ? size_t(sequences) * mtp_kv_bytes(c, o.kv, o.context) : 0;
  const size_t trunk = o.head ? trunk_bytes(w) : trunk_bytes(w) - head_bytes(w) + hand_on_bytes(c);
  return {trunk + (o.mtp ? mtp_trunk_bytes(w) : 0), kv_pool_bytes(c, o) + mtp_kv,
          state_bytes(c, o.kept_rows(), sequences),
          decode_scratch(c, o.context, o.step_rows, o.mtp).total,
          chunk > 0 ? prompt_scratch(w, std::min(chunk, o.context), o.context).total : 0};
}

// The smallest chunk the plan would settle for: kMinPromptChunk, or the wanted one when smaller.
int64_t smallest_chunk(const PlanOptions& o) {
  return o.prompt_chunk > 0 ? std::min({o.prompt_chunk, kMinPromptChunk, o.context}) : 0;
}

// What would fit when the budget cannot hold the fixed part: the longest context in this format,
// and the formats that hold this context.
std::string what_fits(const model::ModelWeights& w, const PlanOptions& o) {
  std::string out;
  if (o.kv_positions > 0) {  // a smaller shared pool first (one context at least)
    PlanOptions smaller = o;
    smaller.kv_positions = o.context;
    if (fixed_at(w, smaller, smallest_chunk(smaller)).total() <= o.budget) {
      int64_t lo = o.context, hi = o.kv_positions;  // the largest pool (in whole pages) that fits
      while (hi - lo > kPagePositions) {
        smaller.kv_positions = (lo + hi) / 2 / kPagePositions * kPagePositions;
        if (smaller.kv_positions <= lo) break;
        (fixed_at(w, smaller, smallest_chunk(smaller)).total() <= o.budget ? lo : hi) = smaller.kv_positions;
      }
      return fmt::format("--kv-positions {} would fit", lo);
    }
  }
  PlanOptions shorter = o;
  int64_t lo = 0, hi = o.context;  // the longest context (in whole pages) that fits
  while (hi - lo > kPagePositions) {
    shorter.context = (lo + hi) / 2 / kPagePositions * kPagePositions;
    if (shorter.context <= lo) break;
    if (o.kv_positions > 0)  // (a pool of every sequence's whole context at most)
      shorter.kv_positions = std::min(o.kv_positions, std::max<int64_t>(o.parallel, 1) * shorter.context);
    (fixed_at(w, shorter, smallest_chunk(shorter)).total() <= o.budget ? lo : hi) = shorter.context;
  }
  if (lo > 0) out += fmt::format("--ctx {} would fit in {}", lo, kv::to_string(o.kv));
  std::vector<std::string> formats;
  for (kv::Format f : kv::all_formats()) {
    if (f == o.kv || !kv::unsupported_reason(f, w.config.head_dim).empty()) continue;
    PlanOptions other = o;
    other.kv = f;
    if (fixed_at(w, other, smallest_chunk(other)).total() <= o.budget) formats.push_back(kv::to_string(f));
  }
  if (!formats.empty())
    out += fmt::format("{}--kv {} would fit at --ctx {}", out.empty() ? "" : "; ", fmt::join(formats, " or --kv "),
                       o.context);
  return out.empty() ? "no context or K/V format fits this budget; use a smaller model" : out;
}

}  // namespace

std::string kv_note(const PlanOptions& o) {
  const int64_t sequences = std::max<int64_t>(o.parallel, 1);
  if (o.kv_positions <= 0) return fmt::format("{} x {} positions in {}", sequences, o.context, kv::to_string(o.kv));
  return fmt::format("{} positions shared by {} sequence(s) of up to {}, in {}", o.kv_positions, sequences, o.context,
                     kv::to_string(o.kv));
}

size_t head_bytes(const model::ModelWeights& w) { return vector_bytes(w.output_norm) + matrix_bytes(w.output); }

size_t hand_on_bytes(const model::Qwen35MoeConfig& c) { return size_t(c.hidden) * 4; }

size_t trunk_bytes(const model::ModelWeights& w) {
  size_t total = head_bytes(w);
  for (size_t layer = 0; layer < w.layers.size(); ++layer) total += layer_trunk_bytes(w, layer);
  return total;
}

size_t layer_trunk_bytes(const model::ModelWeights& w, size_t layer) { return layer_bytes_of(w.config, w.layers[layer]); }

size_t mtp_trunk_bytes(const model::ModelWeights& w) {
  if (!w.mtp) return 0;
  const model::MtpWeights& m = *w.mtp;
  // Its layer as a main layer's, less the residency flags (its experts are all in VRAM), plus the
  // experts' stacks whole.
  size_t total = vector_bytes(m.enorm) + vector_bytes(m.hnorm) + vector_bytes(m.shared_head_norm) +
                 matrix_bytes(m.eh_proj) + layer_bytes_of(w.config, m.layer) - size_t(w.config.n_experts);
  for (const model::ExpertStack* s : {&m.layer.moe.gate, &m.layer.moe.up, &m.layer.moe.down})
    total += size_t(s->n_experts) * s->expert_stride;
  // And the embedding table, which decode steps look up on the host: a verify step drafts from its
  // rows' greedy tokens on the device (cuda::CudaSession::WindowDrafts), where the GPU can expand its
  // type (not the grid i-quants: then nothing is armed and the table stays on the host). A tied lm
  // head is it already.
  const model::MatrixView& table = w.token_embd;
  if (table.data != w.output.data && cuda::expandable(table.type->type, table.cols)) total += matrix_bytes(table);
  return total;
}

size_t mtp_kv_bytes(const model::Qwen35MoeConfig& c, kv::Format fallback, int64_t context) {
  return kv_layer_bytes(c, kv::mtp_format(c.head_dim, fallback), context) + kv_page_table_bytes(context);
}


size_t kv_layer_bytes(const model::Qwen35MoeConfig& c, kv::Format format, int64_t context) {
  const kv::Layout layout = kv::layout(format);
  const int64_t pages = (context + kPagePositions - 1) / kPagePositions;
  return size_t(pages * kPagePositions) *
         size_t(kv::row_bytes(layout.k, c.n_kv_heads, c.head_dim) + kv::row_bytes(layout.v, c.n_kv_heads, c.head_dim));
}

size_t kv_page_table_bytes(int64_t context) {
  return size_t(std::max<int64_t>((context + kPagePositions - 1) / kPagePositions, 1)) * 4;
}

size_t kv_bytes(const model::Qwen35MoeConfig& c, kv::Format format, int64_t context) {
  return size_t(c.n_full_attention_layers()) * kv_layer_bytes(c, format, context) + kv_page_table_bytes(context);
}

size_t kv_pool_bytes(const model::Qwen35MoeConfig& c, const PlanOptions& o) {
  const int64_t sequences = std::max<int64_t>(o.parallel, 1);
  if (o.kv_positions <= 0) return size_t(sequences) * kv_bytes(c, o.kv, o.context);
  return size_t(c.n_full_attention_layers()) * kv_layer_bytes(c, o.kv, o.kv_positions) +
         size_t(sequences) * kv_page_table_bytes(o.context);
}

size_t state_layer_bytes(const model::Qwen35MoeConfig& c, int64_t window_rows, int64_t sequences) {
  const size_t one = floats_bytes(c.conv_channels() * (c.ssm_conv_kernel - 1)) +
                     floats_bytes(c.ssm_dt_rank * c.ssm_state * c.ssm_state);
  return size_t(std::max<int64_t>(sequences, 1) + (window_rows > 1 ? window_rows - 1 : 0)) * one;
}

size_t state_bytes(const model::Qwen35MoeConfig& c, int64_t window_rows, int64_t sequences) {
  return size_t(c.n_layers - c.n_full_attention_layers()) * state_layer_bytes(c, window_rows, sequences);
}

std::vector<ExpertBytes> expert_bytes(const model::ModelWeights& w) {
  std::vector<ExpertBytes> out;
  for (const model::LayerWeights& l : w.layers)
    out.push_back({matrix_bytes(l.moe.gate.first), matrix_bytes(l.moe.up.first), matrix_bytes(l.moe.down.first)});
  return out;
}

size_t default_budget(size_t free_bytes, size_t total_bytes) {
  const size_t margin = std::max<size_t>(size_t(512) << 20, total_bytes / 20);
  return free_bytes > margin ? free_bytes - margin : 0;
}

MemoryPlan plan_memory(const model::ModelWeights& w, const PlanOptions& o) {
  const model::Qwen35MoeConfig& c = w.config;
  if (o.context <= 0) fail("memory plan: the context must be positive");
  MemoryPlan p;
  p.options = o;
  int64_t chunk = o.prompt_chunk > 0 ? std::min(o.prompt_chunk, o.context) : 0;
  const int64_t smallest = smallest_chunk(o);
  Fixed fixed = fixed_at(w, o, chunk);
  while (fixed.total() > o.budget && chunk > smallest) {
    chunk = std::max(chunk / 2, smallest);
    fixed = fixed_at(w, o, chunk);
  }
  if (fixed.total() > o.budget)
    fail_budget("VRAM budget of {:.1f} MiB cannot hold the trunk ({:.1f} MiB), the K/V cache ({}: {:.1f} MiB), the "
         "DeltaNet states ({:.1f} MiB) and the scratch for prompt chunks of {} ({:.1f} MiB): short by {:.1f} MiB; "
         "raise --vram-budget, or: {}",
         mib(o.budget), mib(fixed.trunk), kv_note(o), mib(fixed.kv), mib(fixed.states), chunk,
         mib(fixed.decode + fixed.prompt), mib(fixed.total() - o.budget), what_fits(w, o));
  p.trunk = fixed.trunk, p.kv = fixed.kv, p.states = fixed.states;
  p.decode_scratch = fixed.decode, p.prompt_scratch = fixed.prompt, p.prompt_chunk = chunk;
  p.expert_bytes = expert_bytes(w);
  for (const ExpertBytes& e : p.expert_bytes) {
    p.slot_bytes = std::max(p.slot_bytes, (e.total() + 255) / 256 * 256);
    p.experts_host += e.total() * size_t(c.n_experts);
  }
  p.experts_total = c.n_layers * c.n_experts;
  const int64_t room = p.slot_bytes > 0 ? int64_t((o.budget - fixed.total()) / p.slot_bytes) : 0;
  p.experts_resident = std::min(room, p.experts_total);
  if (o.max_resident_experts >= 0) p.experts_resident = std::min(p.experts_resident, o.max_resident_experts);
  p.expert_slots = size_t(p.experts_resident) * p.slot_bytes;
  p.host_pinned = p.all_resident() ? 0 : p.experts_host;
  return p;
}

size_t host_ram_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kib = 0, total = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemTotal:") total = kib << 10;
    meminfo.ignore(64, '\n');
  }
  return total;
}

void check_host_ram(size_t bytes) {
  const size_t total = host_ram_bytes();
  if (total == 0) return;  // not Linux: nothing to check against
  const size_t keep = size_t(2) << 30;
  const size_t usable = total > keep ? total - keep : 0;
  if (bytes > usable)
    fail("host RAM: the experts not in VRAM need {:.1f} GiB of pinned host memory, but this machine has {:.1f} GiB "
         "(2 GiB kept for everything else): short by {:.1f} GiB; raise --vram-budget so more experts live on the GPU, "
         "or use a smaller model",
         double(bytes) / double(1 << 30), double(total) / double(1 << 30), double(bytes - usable) / double(1 << 30));
}

MemoryPlan together(std::span<const MemoryPlan> plans) {
  if (plans.empty()) fail("memory plan: no plans to put together");
  MemoryPlan all = plans.front();
  for (const MemoryPlan& p : plans.subspan(1)) {
    all.options.budget += p.options.budget;
    all.trunk += p.trunk, all.kv += p.kv, all.states += p.states;
    all.decode_scratch += p.decode_scratch, all.prompt_scratch += p.prompt_scratch;
    all.expert_bytes.insert(all.expert_bytes.end(), p.expert_bytes.begin(), p.expert_bytes.end());
    all.slot_bytes = std::max(all.slot_bytes, p.slot_bytes);
    all.experts_total += p.experts_total, all.experts_resident += p.experts_resident;
    all.expert_slots += p.expert_slots, all.experts_host += p.experts_host, all.host_pinned += p.host_pinned;
  }
  return all;
}

std::string summary(const MemoryPlan& p) {
  return fmt::format(
      "VRAM plan of {:.1f} MiB: trunk {:.1f}, K/V {:.1f} ({}), DeltaNet states {:.1f}, scratch "
      "{:.1f} (prompt chunks of {}), experts {:.1f} MiB: {} of {} in VRAM ({:.1f}%); host RAM pinned {:.1f} MiB",
      mib(p.options.budget), mib(p.trunk), mib(p.kv), kv_note(p.options), mib(p.states),
      mib(p.decode_scratch + p.prompt_scratch), p.prompt_chunk,
      mib(p.expert_slots), p.experts_resident, p.experts_total, 100.0 * p.resident_fraction(), mib(p.host_pinned));
}

std::string describe(const MemoryPlan& p) {
  const auto row = [](const char* what, size_t bytes, const std::string& note) {
    return fmt::format("  {:<22} {:>10.1f} MiB  {}\n", what, mib(bytes), note);
  };
  const PlanOptions& o = p.options;
  std::string out = fmt::format("VRAM budget {:.1f} MiB\n", mib(o.budget));
  out += row("trunk", p.trunk,
             o.mtp ? "every tensor but the routed experts, the expert tables, and the MTP block's"
                   : "every tensor but the routed experts, and the expert tables");
  out += row("K/V cache", p.kv, kv_note(o) + (o.mtp ? "; the MTP block's of each sequence" : ""));
  out += row("DeltaNet states", p.states,
             fmt::format("{} sequence(s){}", std::max<int64_t>(o.parallel, 1),
                         o.kept_rows() > 1 ? fmt::format(", and kept for {} rows of verify windows", o.kept_rows())
                                           : std::string()));
  out += row("decode scratch", p.decode_scratch, "");
  out += row("prompt scratch", p.prompt_scratch,
             p.prompt_chunk > 0 ? fmt::format("chunks of {} tokens{}", p.prompt_chunk,
                                              p.prompt_chunk < std::min(o.prompt_chunk, o.context)
                                                  ? fmt::format(" (shrunk from {} to fit)", o.prompt_chunk)
                                                  : "")
                                : std::string("prompts token by token"));
  out += row("experts", p.expert_slots,
             fmt::format("{} of {} in VRAM ({:.1f}%), slots of {:.2f} MiB", p.experts_resident, p.experts_total,
                         100.0 * p.resident_fraction(), mib(p.slot_bytes)));
  out += row("left", o.budget - p.used(), "");
  out += fmt::format("host RAM: experts {:.1f} MiB as stored; pinned {:.1f} MiB{}\n", mib(p.experts_host),
                     mib(p.host_pinned), p.all_resident() ? " (every expert is in VRAM)" : "");
  return out;
}

}  // namespace lode::plan
