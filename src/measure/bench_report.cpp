#include "measure/bench_report.h"

#include <fmt/format.h>

#include <cmath>

namespace lode::measure {
namespace {

// Figures rounded to what the measurement can tell (the runs vary by a percent or more).
double rounded(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

nlohmann::json prefill_json(const Ceilings& c, const PrefillFigures& r) {
  return {{"tokens", r.tokens},
          {"tokens_per_s", rounded(r.tokens_per_s, 1)},
          {"TFLOPs", rounded(r.tflops, 2)},
          {"of_tf32", rounded(r.tflops / c.tf32_tflops, 4)},
          {"of_bf16", rounded(r.tflops / c.bf16_tflops, 4)},
          {"hit_rate", rounded(r.tier.hit_rate, 4)},
          {"pcie_bytes", rounded(r.tier.pcie_bytes, 0)}};
}

nlohmann::json decode_json(const Ceilings& c, const DecodeFigures& r) {
  const TierFigures& t = r.tier;
  return {{"depth", r.depth},
          {"tokens_per_s", rounded(r.tokens_per_s, 1)},
          {"bytes_per_token", rounded(r.bytes_per_token, 0)},
          {"GBps", rounded(r.gbps, 1)},
          {"of_copy", rounded(r.gbps / c.copy_gbps, 4)},
          {"hit_rate", rounded(t.hit_rate, 4)},
          {"pcie_bytes_per_token", rounded(t.pcie_bytes, 0)},
          {"cpu_experts_per_token", rounded(t.cpu_experts, 2)},
          {"cpu_hinted_per_token", rounded(t.cpu_hinted, 2)},
          {"cpu_bytes_per_token", rounded(t.cpu_bytes, 0)},
          {"cpu_read_ahead_bytes_per_token", rounded(t.cpu_read_ahead, 0)},
          {"cpu_us_per_token", rounded(1e6 * t.cpu_seconds, 1)},
          {"gpu_share_us_per_token", rounded(1e6 * t.gpu_share_seconds, 1)},
          {"cpu_wait_us_per_token", rounded(1e6 * t.host_wait_seconds, 1)},
          {"swaps", t.swaps}};
}

std::string prefill_line(const Ceilings& c, const BenchRun& b, const PrefillFigures& r) {
  std::string line = fmt::format("pp{:<6} {:9.1f} tokens/s  {:7.2f} TFLOP/s = {:4.1f}% of tf32, {:4.1f}% of bf16",
                                 r.tokens, r.tokens_per_s, r.tflops, 100 * r.tflops / c.tf32_tflops,
                                 100 * r.tflops / c.bf16_tflops);
  if (!b.plan.all_resident())
    line += fmt::format("; hit {:5.1f}%, {:.2f} GB over PCIe a prompt (alone {:.0f} ms at the copy engine's {:.1f} GB/s)",
                        100 * r.tier.hit_rate, r.tier.pcie_bytes / 1e9,
                        1e3 * r.tier.pcie_bytes / (c.pcie_copy_gbps * 1e9), c.pcie_copy_gbps);
  return line + "\n";
}

std::string decode_line(const Ceilings& c, const BenchRun& b, const DecodeFigures& r) {
  const TierFigures& t = r.tier;
  std::string line = fmt::format("tg{} @ depth {:<6} {:7.1f} tokens/s  {:7.1f} MB/token  {:6.1f} GB/s = {:4.1f}% of copy",
                                 b.generated, r.depth, r.tokens_per_s, r.bytes_per_token / 1e6, r.gbps,
                                 100 * r.gbps / c.copy_gbps);
  if (!b.plan.all_resident())
    line += fmt::format("; hit {:5.1f}%, {:6.1f} MB/token over PCIe = {:5.1f} GB/s, {:4.1f}% of mapped reads; {} swaps",
                        100 * t.hit_rate, t.pcie_bytes / 1e6, t.pcie_bytes * r.tokens_per_s / 1e9,
                        100 * t.pcie_bytes * r.tokens_per_s / 1e9 / c.pcie_mapped_gbps, t.swaps);
  if (t.cpu_experts > 0)
    line += fmt::format("; CPU {:.1f} experts/token ({:.1f} hinted, {:.1f} MB read ahead; {:.1f} MB/token from host "
                        "RAM = {:.1f} GB/s), {:.0f} us/token; the GPU's share {:.0f} us/token, then waiting for the "
                        "CPU {:.0f} us/token",
                        t.cpu_experts, t.cpu_hinted, t.cpu_read_ahead / 1e6, t.cpu_bytes / 1e6,
                        t.cpu_bytes * r.tokens_per_s / 1e9, 1e6 * t.cpu_seconds, 1e6 * t.gpu_share_seconds,
                        1e6 * t.host_wait_seconds);
  return line + "\n";
}

constexpr double kAcceptances[] = {0.6, 0.8, 0.9};

// A step of several rows under the tier: the bytes of the absent experts the GPU read over PCIe
// (a grouped step's once a group, cuda::ExpertStats), and the experts the CPU computed with the
// bytes it read from host RAM for them.
std::string rows_tier_text(const TierFigures& t, const char* unit) {
  std::string text = fmt::format("; {:.1f} MB a {} over PCIe", t.pcie_bytes / 1e6, unit);
  if (t.cpu_experts > 0)
    text += fmt::format(", the CPU {:.1f} experts ({:.1f} MB from host RAM)", t.cpu_experts, t.cpu_bytes / 1e6);
  return text;
}

// The same in JSON, beside a window's or step's other figures (keys per `unit`, as decode's per token).
void add_rows_tier_json(nlohmann::json& j, const TierFigures& t, const char* unit) {
  j[fmt::format("pcie_bytes_per_{}", unit)] = rounded(t.pcie_bytes, 0);
  j[fmt::format("cpu_experts_per_{}", unit)] = rounded(t.cpu_experts, 2);
  j[fmt::format("cpu_bytes_per_{}", unit)] = rounded(t.cpu_bytes, 0);
}

nlohmann::json window_json(const WindowFigures& w) {
  nlohmann::json speedups = nlohmann::json::object();
  for (double a : kAcceptances) speedups[fmt::format("{:.1f}", a)] = rounded(w.tokens_at(a) / w.step_ratio, 3);
  nlohmann::json j = {{"depth", w.depth}, {"tokens", w.tokens}, {"ms_per_window", rounded(1e3 * w.seconds, 4)},
                      {"one_token_steps", rounded(w.step_ratio, 3)}, {"speedup_at_acceptance", speedups}};
  add_rows_tier_json(j, w.tier, "window");
  return j;
}

std::string window_line(const BenchRun& b, const WindowFigures& w) {
  std::string speedups;
  for (double a : kAcceptances) speedups += fmt::format("{}{:.2f}x", speedups.empty() ? "" : " / ", w.tokens_at(a) / w.step_ratio);
  std::string line = fmt::format("window {} @ depth {:<6} {:7.3f} ms a window = {:.2f} one-token steps; at acceptance "
                                 "0.6 / 0.8 / 0.9 it would decode {} faster",
                                 w.tokens, w.depth, 1e3 * w.seconds, w.step_ratio, speedups);
  if (!b.plan.all_resident()) line += rows_tier_text(w.tier, "window");
  return line + "\n";
}

nlohmann::json sequences_json(const SequencesFigures& f) {
  nlohmann::json j = {{"depth", f.depth}, {"sequences", f.sequences}, {"ms_per_step", rounded(1e3 * f.seconds, 4)},
                      {"one_token_steps", rounded(f.step_ratio, 3)}};
  if (f.window > 1) {
    nlohmann::json speedups = nlohmann::json::object();
    for (double a : kAcceptances)
      speedups[fmt::format("{:.1f}", a)] = rounded(window_tokens_at(f.window, a) / f.plain_ratio, 3);
    j["window"] = f.window, j["steps_of_one_token_each"] = rounded(f.plain_ratio, 3), j["speedup_at_acceptance"] = speedups;
    if (f.draft_seconds > 0) {
      nlohmann::json drafted = nlohmann::json::object();
      for (double a : kAcceptances)
        drafted[fmt::format("{:.1f}", a)] = rounded(window_tokens_at(f.window, a) / (f.plain_ratio + f.draft_ratio()), 3);
      j["ms_drafting"] = rounded(1e3 * f.draft_seconds, 4), j["speedup_with_drafting_at_acceptance"] = drafted;
    }
  } else {
    j["tokens_per_s"] = rounded(f.tokens_per_s(), 1);
  }
  add_rows_tier_json(j, f.tier, "step");
  return j;
}

std::string sequences_line(const BenchRun& b, const SequencesFigures& f) {
  std::string line;
  if (f.window > 1) {
    std::string speedups;
    for (double a : kAcceptances)
      speedups += fmt::format("{}{:.2f}x", speedups.empty() ? "" : " / ", window_tokens_at(f.window, a) / f.plain_ratio);
    line = fmt::format("{} sequences x window {} @ depth {:<6} {:7.3f} ms a step = {:.2f} steps of one token each; at "
                       "acceptance 0.6 / 0.8 / 0.9 they would decode {} faster",
                       f.sequences, f.window, f.depth, 1e3 * f.seconds, f.plain_ratio, speedups);
    if (f.draft_seconds > 0) {
      std::string drafted;
      for (double a : kAcceptances)
        drafted += fmt::format("{}{:.2f}x", drafted.empty() ? "" : " / ",
                               window_tokens_at(f.window, a) / (f.plain_ratio + f.draft_ratio()));
      line += fmt::format("; drafting them {:.3f} ms ({:.2f} steps), with it {}", 1e3 * f.draft_seconds,
                          f.draft_ratio(), drafted);
    }
  } else {
    line = fmt::format("{} sequences @ depth {:<6} {:7.3f} ms a step = {:.2f} one-token steps; {:8.1f} "
                       "tokens/s in all, {:.2f}x one sequence's",
                       f.sequences, f.depth, 1e3 * f.seconds, f.step_ratio, f.tokens_per_s(),
                       double(f.sequences) / f.step_ratio);
  }
  if (!b.plan.all_resident()) line += rows_tier_text(f.tier, "step");
  return line + "\n";
}

nlohmann::json pieces_json(const PiecesFigures& f) {
  return {{"tokens", f.tokens}, {"prompts", f.prompts}, {"passes", f.passes}, {"ms", rounded(1e3 * f.seconds, 3)},
          {"tokens_per_s", rounded(f.tokens_per_s(), 1)},
          {"x_one_at_a_time", rounded(f.tokens_per_s() / f.alone_tokens_per_s, 3)},
          {"pcie_bytes_per_prompt", rounded(f.tier.pcie_bytes, 0)}};
}

std::string pieces_line(const BenchRun& b, const PiecesFigures& f) {
  std::string line = fmt::format("{} prompts of {} together, {} pass{}: {:7.1f} ms, {:9.1f} tokens/s = {:.2f}x one "
                                 "at a time",
                                 f.prompts, f.tokens, f.passes, f.passes == 1 ? "" : "es", 1e3 * f.seconds,
                                 f.tokens_per_s(), f.tokens_per_s() / f.alone_tokens_per_s);
  if (!b.plan.all_resident()) line += fmt::format("; {:.2f} GB over PCIe a prompt", f.tier.pcie_bytes / 1e9);
  return line + "\n";
}

}  // namespace

double window_tokens_at(int64_t tokens, double acceptance) {
  double sum = 0, term = 1;
  for (int64_t i = 0; i < tokens; ++i, term *= acceptance) sum += term;
  return sum;
}

nlohmann::json to_json(const Ceilings& c, const BenchRun& b) {
  nlohmann::json prefill = nlohmann::json::array(), decode = nlohmann::json::array(), windows = nlohmann::json::array();
  for (const auto& r : b.prefills) prefill.push_back(prefill_json(c, r));
  for (const auto& r : b.decodes) decode.push_back(decode_json(c, r));
  for (const auto& w : b.windows) windows.push_back(window_json(w));
  nlohmann::json sequences = nlohmann::json::array();
  for (const auto& f : b.sequences) sequences.push_back(sequences_json(f));
  nlohmann::json pieces = nlohmann::json::array();
  for (const auto& f : b.pieces) pieces.push_back(pieces_json(f));
  return {{"model", b.model},
          {"vram_budget_MiB", rounded(double(b.plan.options.budget) / double(1 << 20), 1)},
          {"experts_resident", b.plan.experts_resident},
          {"experts_total", b.plan.experts_total},
          {"prefill", prefill},
          {"decode", decode},
          {"windows", windows},
          {"sequences", sequences},
          {"prompts_together", pieces},
          {"generated_tokens", b.generated},
          {"repeats", b.repeats},
          {"copy_ceiling_GBps", rounded(c.copy_gbps, 1)},
          {"bf16_ceiling_TFLOPs", rounded(c.bf16_tflops, 1)},
          {"tf32_ceiling_TFLOPs", rounded(c.tf32_tflops, 1)},
          {"pcie_copy_GBps", rounded(c.pcie_copy_gbps, 1)},
          {"pcie_mapped_read_GBps", rounded(c.pcie_mapped_gbps, 1)},
          {"peak_vram_MiB", rounded(b.peak_mib, 1)},
          {"weights_MiB", rounded(b.weights_mib, 1)},
          {"load_s", rounded(b.load_s, 2)},
          {"kv", b.kv},
          {"prompt_chunk", b.prompt_chunk},
          {"context", b.context},
          {"fill", b.fill},
          {"gpus_layout", b.layout},
          {"host_tier", b.host_tier},
          {"miss_path", b.miss_path}};
}

std::string to_text(const Ceilings& c, const BenchRun& b) {
  std::string text = plan::summary(b.plan) + "\n";
  if (!b.layout.empty()) text += b.layout + "\n(the ceilings above are GPU 0's)\n";
  text += fmt::format("experts in host RAM: {}; weights on the GPU {:.1f} MiB, loaded in {:.1f} s; K/V cells {} for {} "
                      "positions; prompt chunks of {}; depths reached by {}\n",
                      b.host_tier, b.weights_mib, b.load_s, b.kv, b.context, b.prompt_chunk,
                      b.fill == "random" ? "random cells" : "a prompt");
  if (!b.plan.all_resident()) text += fmt::format("decode misses: {}\n", b.miss_path);
  for (const auto& r : b.prefills) text += prefill_line(c, b, r);
  for (const auto& r : b.decodes) text += decode_line(c, b, r);
  for (const auto& w : b.windows) text += window_line(b, w);
  for (const auto& f : b.sequences) text += sequences_line(b, f);
  for (const auto& f : b.pieces) text += pieces_line(b, f);
  text += fmt::format("peak VRAM held by lode: {:.1f} MiB (median of {} runs after a warm-up each)\n", b.peak_mib,
                      b.repeats);
  return text;
}

std::string ceilings_text(const Ceilings& c) {
  return fmt::format("ceilings measured now: copy {:.0f} GB/s; matmul bf16 {:.0f} TFLOP/s, tf32 {:.0f} TFLOP/s; host "
                     "to device {:.1f} GB/s by the copy engine, {:.1f} GB/s by kernels reading pinned memory in place\n",
                     c.copy_gbps, c.bf16_tflops, c.tf32_tflops, c.pcie_copy_gbps, c.pcie_mapped_gbps);
}

}  // namespace lode::measure
