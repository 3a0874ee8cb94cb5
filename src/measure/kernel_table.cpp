#include "measure/kernel_table.h"

#include <fmt/format.h>

#include <algorithm>

namespace lode::measure {

std::string kernel_table_text(std::vector<cuda::KernelClassTime> classes, int64_t steps, int64_t depth,
                              double copy_gbps) {
  std::stable_sort(classes.begin(), classes.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  double total = 0, bytes = 0;
  for (const auto& c : classes) total += c.seconds, bytes += c.bytes;
  const double n = double(std::max<int64_t>(steps, 1));
  std::string out = fmt::format(
      "where a decode step goes kernel by kernel at depth {} (an event after each kernel, no waits inside a step; "
      "{:.3f} ms per token in all, {:.1f} MB moved, {:.0f} GB/s):\n",
      depth, 1e3 * total / n, bytes / n / 1e6, total > 0 ? bytes / total / 1e9 : 0.0);
  out += fmt::format("  {:<44} {:>8} {:>9} {:>9} {:>6} {:>9} {:>7}{}\n", "kernel", "per step", "us each", "us/step",
                     "share", "MB/step", "GB/s", copy_gbps > 0 ? "  of copy" : "");
  for (const auto& c : classes) {
    const double per_step = double(c.launches) / n;
    const std::string each = c.launches > 0 ? fmt::format("{:.1f}", 1e6 * c.seconds / double(c.launches)) : "-";
    std::string moved = "-", rate = "-", of_copy;
    if (c.bytes > 0 && c.seconds > 0) {
      const double gbps = c.bytes / c.seconds / 1e9;
      moved = fmt::format("{:.2f}", c.bytes / n / 1e6), rate = fmt::format("{:.0f}", gbps);
      if (copy_gbps > 0) of_copy = fmt::format("  {:6.1f}%", 100.0 * gbps / copy_gbps);
    }
    out += fmt::format("  {:<44} {:>8.1f} {:>9} {:>9.1f} {:>5.1f}% {:>9} {:>7}{}\n", c.name, per_step, each,
                       1e6 * c.seconds / n, total > 0 ? 100.0 * c.seconds / total : 0.0, moved, rate, of_copy);
  }
  return out;
}

std::string step_cost_table_text(double full_step_seconds, std::vector<StepWithout> rows, int64_t depth) {
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.step_seconds < b.step_seconds; });  // costliest first
  std::string out = fmt::format(
      "what each kernel class costs inside the overlapped step at depth {} (the step timed without its launches, "
      "whose outputs are then meaningless; the whole step {:.3f} ms):\n",
      depth, 1e3 * full_step_seconds);
  out += fmt::format("  {:<44} {:>8} {:>13} {:>9} {:>9} {:>6}\n", "kernel", "per step", "step without", "us/step",
                     "us each", "share");
  for (const auto& r : rows) {
    const double cost = full_step_seconds - r.step_seconds;
    const std::string each = r.launches > 0 ? fmt::format("{:.1f}", 1e6 * cost / r.launches) : "-";
    out += fmt::format("  {:<44} {:>8.1f} {:>10.3f} ms {:>9.1f} {:>9} {:>5.1f}%\n", r.name, r.launches,
                       1e3 * r.step_seconds, 1e6 * cost, each,
                       full_step_seconds > 0 ? 100.0 * cost / full_step_seconds : 0.0);
  }
  return out;
}

}  // namespace lode::measure
