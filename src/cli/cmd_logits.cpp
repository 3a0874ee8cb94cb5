// `lode logits -m MODEL --tokens 1,2,3 -o OUT.f32`: float32 logits of every position, row-major
// [n_tokens, n_vocab], little-endian.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/output_file.h"
#include "core/error.h"
#include "cpu/session.h"

namespace lode::cli {
namespace {

struct LogitsOptions {
  ModelRunOptions run;
  std::string output;
};

void run_logits(const LogitsOptions& o) {
  const std::vector<int32_t> tokens = parse_token_list(o.run.tokens);
  const std::vector<std::filesystem::path> inputs = gguf::model_files(o.run.model);
  if (o.output != "-") checked_output_path(o.output, inputs);  // (before the work, as again when writing)
  gguf::Reader reader(o.run.model);
  const auto config = model::read_config(reader.metadata());
  cpu::Session session(reader, config, o.run.session_options());
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float> logits = session.prefill(tokens, o.run.chunk, /*all_logits=*/true);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i]))
      fail("the logit of token {} at position {} is {}: the model produced an invalid value (check the weights and "
           "the backend)", i % size_t(session.vocab()), i / size_t(session.vocab()), logits[i]);
  write_output_file(
      o.output,
      [&](std::FILE* out) {
        if (std::fwrite(logits.data(), sizeof(float), logits.size(), out) != logits.size())
          fail("{}: write failed (disk full?)", o.output);
      },
      inputs);
  fmt::print(stderr, "wrote {} ({} positions x {} logits; {:.3f} s, {:.1f} tokens/s; K/V {})\n", o.output,
             tokens.size(), session.vocab(), seconds, double(tokens.size()) / seconds,
             kv::to_string(session.kv_format()));
}

}  // namespace

void add_logits_command(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  auto* cmd = app.add_subcommand("logits", "Write the float32 logits of every prompt position");
  add_model_run_options(*cmd, o->run, PromptInput::token_ids);
  cmd->add_option("-o,--output", o->output, "Output file: [n_tokens, n_vocab] float32")->required();
  cmd->callback([o] { run_logits(*o); });
}

}  // namespace lode::cli
