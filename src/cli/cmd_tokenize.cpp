// `lode tokenize -m MODEL (-p TEXT | -f FILE) [--special]`: the prompt's token ids, space-separated
// on one line (with -f, the speed on stderr). `lode detokenize -m MODEL --ids 1,2,3`: the text,
// written exactly (no newline added).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <cstdio>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/validators.h"
#include "core/error.h"
#include "gguf/reader.h"
#include "tokenizer/tokenizer.h"

namespace lode::cli {
namespace {

struct TokenizeOptions {
  ModelRunOptions input;  // only the model path and the prompt are used
  bool special = false;
};

void run_tokenize(const TokenizeOptions& o) {
  if (o.input.prompt.empty() && o.input.prompt_file.empty()) fail("no text: give -p TEXT or -f FILE");
  const std::string text = read_prompt_text(o.input);
  const gguf::Reader reader(o.input.model);
  const auto tokenizer = tokenizer::Tokenizer::from_metadata(reader.metadata());
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tokenizer.encode(text, o.special);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string line;
  line.reserve(ids.size() * 7);
  for (size_t i = 0; i < ids.size(); ++i) fmt::format_to(std::back_inserter(line), "{}{}", i ? " " : "", ids[i]);
  fmt::print("{}\n", line);
  if (!o.input.prompt_file.empty())
    fmt::print(stderr, "{} bytes -> {} tokens in {:.3f} s ({:.0f} tokens/s, {:.1f} MB/s)\n", text.size(), ids.size(),
               seconds, double(ids.size()) / std::max(seconds, 1e-9), double(text.size()) / 1e6 / std::max(seconds, 1e-9));
}

void run_detokenize(const std::string& model_path, const std::string& ids_text, bool skip_special) {
  const gguf::Reader reader(model_path);
  const auto tokenizer = tokenizer::Tokenizer::from_metadata(reader.metadata());
  const std::string text = tokenizer.decode(parse_token_list(ids_text, "--ids"), !skip_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace

void add_tokenize_commands(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* tok = app.add_subcommand("tokenize", "Print the token ids of a text");
  tok->add_option("-m,--model", o->input.model, "GGUF model whose tokenizer to use")->required();
  auto* text = tok->add_option("-p,--prompt", o->input.prompt, "Text to tokenize");
  tok->add_option("-f,--file", o->input.prompt_file, "Tokenize this file, - for standard input (prints the speed on stderr)")
      ->check(file_or_stdin())->excludes(text);
  tok->add_flag("--special", o->special, "Special-token text (<|im_start|>...) becomes special ids");
  tok->callback([o] { run_tokenize(*o); });

  struct Detok {
    std::string model, ids;
    bool skip_special = false;
  };
  auto d = std::make_shared<Detok>();
  auto* detok = app.add_subcommand("detokenize", "Print the text of token ids (exactly, no newline added)");
  detok->add_option("-m,--model", d->model, "GGUF model whose tokenizer to use")->required();
  detok->add_option("--ids", d->ids, "Token ids, comma-separated: 1,2,3")->required();
  detok->add_flag("--skip-special", d->skip_special, "Leave control tokens out of the text");
  detok->callback([d] { run_detokenize(d->model, d->ids, d->skip_special); });
}

}  // namespace lode::cli
