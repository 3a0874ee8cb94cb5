// Writing a command's output file so that a failure never leaves a half-written file under the
// final name: `write` fills PATH.partial, which is renamed to PATH only when complete.
#pragma once
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

#include "core/error.h"

namespace lode::cli {

inline void write_output_file(const std::string& path, const std::function<void(std::FILE*)>& write) {
  const std::string partial = path + ".partial";
  std::FILE* out = std::fopen(partial.c_str(), "wb");
  if (!out) fail("{}: cannot open for writing", partial);
  try {
    write(out);
  } catch (...) {
    std::fclose(out);
    std::filesystem::remove(partial);
    throw;
  }
  if (std::fclose(out) != 0) {
    std::filesystem::remove(partial);
    fail("{}: write failed (disk full?)", partial);
  }
  std::filesystem::rename(partial, path);
}

}  // namespace lode::cli
