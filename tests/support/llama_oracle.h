// llama.cpp's npm CPU build as an oracle in tests: runs tools/oracle/llama_run (which compiles
// tools/oracle/llama_logits.c) on a GGUF and reads back its logits and greedy steps. Tests that use
// it skip when the build has not been fetched (tools/oracle/fetch; scripts/test fetches it).
// Tests pass --threads 1: ctest runs tests side by side, and llama.cpp's worker threads spin while
// they wait, so two runs of 2 threads on 2 cores slow each other down 20-fold.
#pragma once
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "support/paths.h"
#include "support/run_lode.h"

namespace lode::test {

namespace fs = std::filesystem;

inline const fs::path kRepo = lode::test::repo_root();
inline const fs::path kOracleLib = kRepo / "tools/oracle/.cache/package/bins/linux-x64/libllama.v0.5.0.so";

inline bool oracle_available() { return fs::exists(kOracleLib); }

inline int argmax(const float* row, int n_vocab) { return int(std::max_element(row, row + n_vocab) - row); }

inline double softmax_of(const float* row, int n_vocab, int id) {
  const double max = *std::max_element(row, row + n_vocab);
  double sum = 0;
  for (int v = 0; v < n_vocab; ++v) sum += std::exp(double(row[v]) - max);
  return std::exp(double(row[id]) - max) / sum;
}

struct OracleRun {
  RunResult result;
  std::vector<float> logits;  // [n_tokens, n_vocab]
};

inline std::string join(const std::vector<int>& ids) {
  std::string text;
  for (int id : ids) text += (text.empty() ? "" : ",") + std::to_string(id);
  return text;
}

inline OracleRun run_oracle(const fs::path& model, const std::vector<int>& tokens, const std::string& extra,
                     const fs::path& scratch, const std::string& out_name) {
  const fs::path out = scratch / out_name;
  fs::remove(out);  // a failed run must not leave an earlier run's logits to read
  const std::string command = "'" + (kRepo / "tools/oracle/llama_run").string() + "' '" + model.string() +
                              "' --tokens " + join(tokens) + " -o '" + out.string() + "' " + extra;
  OracleRun run;
  // run_lode runs lode_binary(); the oracle is a script, so the shell line is run here the same way.
  const fs::path stdout_path = scratch / "oracle_stdout.txt", stderr_path = scratch / "oracle_stderr.txt";
  const int raw = std::system((command + " >'" + stdout_path.string() + "' 2>'" + stderr_path.string() + "'").c_str());
  run.result.status = (raw != -1 && WIFEXITED(raw)) ? WEXITSTATUS(raw) : -1;
  run.result.out = slurp(stdout_path);
  run.result.err = slurp(stderr_path);
  const std::string bytes = slurp(out);
  run.logits.resize(bytes.size() / sizeof(float));
  std::memcpy(run.logits.data(), bytes.data(), run.logits.size() * sizeof(float));
  return run;
}

struct GreedyStep {
  int top1, top2;
  double p1, p2;
};

// stdout of --greedy: the ids on one line, then "step I top1 ID P top2 ID P" per step.
inline std::vector<GreedyStep> parse_greedy(const std::string& text, std::vector<int>& ids) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  std::istringstream id_line(line);
  for (int id; id_line >> id;) ids.push_back(id);
  std::vector<GreedyStep> steps;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string word;
    int index;
    GreedyStep s;
    fields >> word >> index >> word >> s.top1 >> s.p1 >> word >> s.top2 >> s.p2;
    if (fields) steps.push_back(s);
  }
  return steps;
}

}  // namespace lode::test
