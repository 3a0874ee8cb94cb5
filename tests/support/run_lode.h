// Runs the lode binary (the one this build made) with arguments, capturing its exit status,
// stdout and stderr: for tests of the command line as users meet it.
#pragma once
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "support/paths.h"

namespace lode::test {

struct RunResult {
  int status = -1;  // the exit code; -1 when the process did not exit normally (a crash)
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `args` is pasted into a shell command line: quote paths with spaces yourself. `scratch` is a
// directory for the captured streams.
inline RunResult run_lode(const std::string& args, const std::filesystem::path& scratch) {
  const auto out = scratch / "stdout.txt", err = scratch / "stderr.txt";
  const std::string command =
      "'" + lode::test::lode_binary() + "' " + args + " >'" + out.string() + "' 2>'" + err.string() + "'";
  const int raw = std::system(command.c_str());
  RunResult r;
  r.status = (raw != -1 && WIFEXITED(raw)) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace lode::test
