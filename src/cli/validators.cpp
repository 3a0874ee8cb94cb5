#include "cli/validators.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <string>
#include <thread>

namespace lode::cli {
namespace {

template <class T>
bool parse_whole(const std::string& text, T& value) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() && end == text.data() + text.size();
}

bool parse_number(const std::string& text, double& value) {
  try {
    size_t used = 0;
    value = std::stod(text, &used);
    return used == text.size();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

CLI::Validator integer_at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        int64_t value = 0;
        if (!parse_whole(text, value) || value < lo) return fmt::format("must be an integer of at least {}, got {}", lo, text);
        return "";
      },
      fmt::format("INT >= {}", lo));
}

CLI::Validator number_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double value = 0;
        if (!parse_number(text, value) || !(value >= lo && value <= hi))
          return fmt::format("must be a number from {} to {}, got {}", lo, hi, text);
        return "";
      },
      fmt::format("in [{}, {}]", lo, hi));
}

CLI::Validator number_at_least(double lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        double value = 0;
        if (!parse_number(text, value) || !std::isfinite(value) || value < lo)
          return fmt::format("must be a number of at least {}, got {}", lo, text);
        return "";
      },
      fmt::format(">= {}", lo));
}

CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (!parse_number(text, value) || !std::isfinite(value)) return fmt::format("must be a finite number, got {}", text);
        return "";
      },
      "FINITE");
}

CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t value = 0;
        if (!parse_whole(text, value))
          return fmt::format("must be an integer from 0 to 18446744073709551615, got {}", text);
        return "";
      },
      "UINT64");
}

CLI::Validator non_empty() {
  return CLI::Validator([](std::string& text) -> std::string { return text.empty() ? "must not be empty" : ""; },
                        "TEXT");
}

CLI::Validator thread_count() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const int64_t most = 4 * int64_t(std::max(1u, std::thread::hardware_concurrency()));
        int64_t value = 0;
        if (!parse_whole(text, value) || value < 0 || value > most)
          return fmt::format("must be 0 (every core) or up to {} (4 per hardware thread of this machine), got {}", most,
                             text);
        return "";
      },
      "0..4 x cores");
}

CLI::Validator file_or_stdin() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text == "-" ? "" : CLI::ExistingFile(text); },
      "FILE or - (standard input)");
}

}  // namespace lode::cli
