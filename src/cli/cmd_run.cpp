// `lode run -m MODEL (-p TEXT | -f FILE | --tokens 1,2,3) [-n N] [sampling] [--ids] [--backend cpu|cuda]`:
// generation from a raw prompt (no chat template) on the CPU engine or the GPU, streaming the text
// (or the ids with --ids) to stdout and the speed to stderr.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/backend.h"
#include "cli/commands.h"
#include "cli/loaded_model.h"
#include "cli/sampling_options.h"
#include "cli/validators.h"
#include "core/error.h"
#include "engine/generate.h"


namespace lode::cli {
namespace {

struct RunOptions {
  ModelRunOptions run;
  SamplingCliOptions sampling;
  DraftCliOptions draft;
  int64_t n_predict = 128;
  std::vector<std::string> stop;
  bool ids = false;
  bool ignore_eos = false;
  bool special = false;
  BackendOptions backend;
};

void run_generate(const RunOptions& o) {
  const std::string text = read_prompt_text(o.run);
  if (o.run.tokens.empty() && text.empty()) {
    if (o.run.prompt_file == "-") fail("the prompt read from standard input (-f -) is empty");
    if (!o.run.prompt_file.empty()) fail("the prompt file {} is empty", o.run.prompt_file);
    fail("no prompt: give -p TEXT, -f FILE or --tokens 1,2,3");
  }
  LoadedModel model(o.run);
  const std::vector<int32_t> prompt =
      o.run.tokens.empty() ? model.text().encode(text, o.special) : parse_token_list(o.run.tokens);
  const sample::SamplingParams params = sampling_params(o.sampling, model.vocab());
  sample::Sampler sampler(params, model.vocab());

  engine::GenerateOptions g{.max_tokens = o.n_predict, .sampling = params, .stop_strings = o.stop,
                            .stop_at_end_of_generation = !o.ignore_eos, .render_special = o.special,
                            .chunk = o.run.chunk, .cancel = nullptr, .steer = std::nullopt,
                            .mtp = o.draft.mtp, .mtp_min_p = o.draft.min_p};
  if (o.ids && o.draft.mtp > 0) fail("--mtp drafts text generation; run it without --ids");
  const std::unique_ptr<engine::Sequence> sequence = open_sequence(o.backend, model, o.run, o.draft.mtp);
  if (o.draft.mtp > 0)
    fmt::print(stderr, "lode: {}; up to {} drafted tokens per step\n", sequence->drafter().describe(), o.draft.mtp);
  engine::GenerateResult result;
  if (o.ids) {
    // Exactly -n ids, no tokenizer needed: a model without one still runs.
    result = engine::generate_tokens(*sequence, sampler, prompt, o.n_predict, o.run.chunk,
                                     [](int32_t) { return true; });
    for (size_t i = 0; i < result.tokens.size(); ++i) fmt::print("{}{}", i ? " " : "", result.tokens[i]);
    fmt::print("\n");
  } else {
    result = engine::generate(*sequence, model.text(), sampler, prompt, g, [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
    fmt::print("\n");
  }
  std::fflush(stdout);
  fmt::print(stderr, "{}; stopped by {}; seed {}\n", engine::speed_report(result),
             engine::to_string(result.finish), params.seed);
  if (const std::string activity = sequence->model().activity(); !activity.empty()) fmt::print(stderr, "lode: {}\n", activity);
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Generate text from a raw prompt");
  add_model_run_options(*cmd, o->run, PromptInput::ids_or_text);
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate at most (default 128)")->check(integer_at_least(1));
  add_sampling_options(*cmd, o->sampling);
  add_draft_options(*cmd, o->draft);
  cmd->add_option("--stop", o->stop, "Stop when this text appears (repeatable)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_flag("--special", o->special, "Special-token text in the prompt becomes special ids; show them in the output");
  cmd->add_flag("--ids", o->ids, "Print exactly -n generated token ids instead of text (needs no tokenizer)");
  add_backend_options(*cmd, o->backend);
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace lode::cli
