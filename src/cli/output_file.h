// Writing a command's output file so that a failure never leaves a half-written file under the
// final name: `write` fills PATH.partial, which is renamed to PATH only when complete. "-" is
// standard output. The path is checked first (core/output_path.h): not a directory, a device or
// one of `inputs`, the command's own input files.
#pragma once
#include <cstdio>
#include <filesystem>
#include <functional>
#include <span>
#include <string>

#include "core/error.h"
#include "core/output_path.h"

namespace lode::cli {

inline void write_output_file(const std::string& path, const std::function<void(std::FILE*)>& write,
                              std::span<const std::filesystem::path> inputs = {}) {
  if (path == "-") {
    write(stdout);
    if (std::fflush(stdout) != 0) fail("standard output: write failed");
    return;
  }
  const std::filesystem::path target = checked_output_path(path, inputs);
  const std::string partial = target.string() + ".partial";
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
  put_in_place(partial, target);
}

}  // namespace lode::cli
