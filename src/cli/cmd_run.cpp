// `lode run -m MODEL --tokens 1,2,3 -n N --temp 0 --ids`: greedy generation on the CPU engine,
// printing the generated ids space-separated on one line, and the speed on stderr.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "cpu/session.h"

namespace lode::cli {
namespace {

struct RunOptions {
  ModelRunOptions run;
  int64_t n_predict = 16;
  double temp = 0;
  bool ids = false;
};

int32_t argmax(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void run_generate(const RunOptions& o) {
  if (o.temp != 0)
    fail("--temp {}: only greedy decoding (--temp 0) exists so far; sampling comes with the tokenizer", o.temp);
  if (!o.ids) fail("--ids is required for now: text output comes with the tokenizer");
  const std::vector<int32_t> prompt = parse_token_list(o.run.tokens);
  gguf::Reader reader(o.run.model);
  const auto config = model::read_config(reader.metadata());
  cpu::Session session(reader, config, {.threads = o.run.threads, .max_context = o.run.ctx});
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  std::vector<float> logits = session.prefill(prompt, o.run.chunk);
  const auto t1 = clock::now();
  std::vector<int32_t> out;
  for (int64_t i = 0; i < o.n_predict; ++i) {
    out.push_back(argmax(logits));
    if (i + 1 < o.n_predict) logits = session.decode(out.back());
  }
  const auto t2 = clock::now();
  for (size_t i = 0; i < out.size(); ++i) fmt::print("{}{}", i ? " " : "", out[i]);
  fmt::print("\n");
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  const size_t steps = out.size() - 1;  // the first token comes from the prompt's logits
  fmt::print(stderr, "prompt: {} tokens in {:.3f} s ({:.2f} tok/s); decode: {} steps in {:.3f} s ({:.2f} tok/s)\n",
             prompt.size(), prefill_s, double(prompt.size()) / prefill_s, steps, decode_s,
             steps ? double(steps) / decode_s : 0.0);
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Generate tokens from a prompt of token ids (CPU)");
  add_model_run_options(*cmd, o->run);
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate (default 16)")->check(CLI::PositiveNumber);
  cmd->add_option("--temp", o->temp, "Temperature (only 0, greedy, for now)");
  cmd->add_flag("--ids", o->ids, "Print token ids (the only output format for now)");
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace lode::cli
