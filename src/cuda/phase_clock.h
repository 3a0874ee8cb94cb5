// Where GPU time goes, for `lode bench --profile`: each mark waits for the device and books the
// time since the previous mark to a phase. Waiting slows the work it measures, so a session only
// keeps a clock when asked to.
#pragma once
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "cuda/vram.h"

namespace lode::cuda {

class PhaseClock {
 public:
  PhaseClock(std::vector<std::string> names, bool enabled)
      : names_(std::move(names)), seconds_(names_.size(), 0.0), enabled_(enabled) {}

  void start() { last_ = std::chrono::steady_clock::now(); }
  // Waits for the device; the time since the last mark (or start) goes to `phase`.
  void mark(size_t phase) {
    if (!enabled_) return;
    synchronize();
    const auto now = std::chrono::steady_clock::now();
    seconds_[phase] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }
  bool enabled() const { return enabled_; }
  // Seconds booked so far, per phase, in the order of the names.
  std::vector<std::pair<std::string, double>> totals() const {
    std::vector<std::pair<std::string, double>> out;
    for (size_t p = 0; p < names_.size(); ++p) out.emplace_back(names_[p], seconds_[p]);
    return out;
  }

 private:
  std::vector<std::string> names_;
  std::vector<double> seconds_;
  bool enabled_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace lode::cuda
