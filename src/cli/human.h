// Sizes for people: "1.50 GiB", "812 B".
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace lode::cli {

inline std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) { v /= 1024.0; ++u; }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", v, units[u]);
}

}  // namespace lode::cli
