// `lode chat -m MODEL [--system TEXT] [--no-think] [sampling] [--backend cpu|cuda]`: an interactive
// conversation on the CPU engine or the GPU with Qwen's chat template. Each line on stdin is a user turn (piped input works too);
// /think on|off, /reset and /quit are commands. The conversation stays in the session's cache
// between turns: a turn prefills only its own tokens. The history is kept as the model saw it,
// reasoning included (what Qwen3.6 calls preserve_thinking), rather than re-rendered without it,
// because re-rendering would change earlier tokens and force the whole conversation to be recomputed.
#include <fmt/format.h>
#include <unistd.h>

#include <iostream>

#include "chat/output_parser.h"
#include "chat/template.h"
#include "cli/backend.h"
#include "cli/commands.h"
#include "cli/loaded_model.h"
#include "cli/sampling_options.h"
#include "cli/validators.h"
#include "core/error.h"
#include "engine/generate.h"

namespace lode::cli {
namespace {

struct ChatOptions {
  ModelRunOptions run;
  SamplingCliOptions sampling;
  DraftCliOptions draft;
  int64_t n_predict = 1024;
  std::string system;
  bool no_think = false;
  BackendOptions backend;
};

class Chat {
 public:
  explicit Chat(const ChatOptions& o)
      : o_(o), model_(o.run), params_(sampling_params(o.sampling, model_.vocab())),
        sampler_(params_, model_.vocab()), thinking_(!o.no_think),
        tty_(isatty(fileno(stdout)) != 0) {
    model_.text();  // fail now, not at the first turn, when the model has no tokenizer
    sequence_ = open_sequence(o.backend, model_, o.run, o.draft.mtp);
    if (o.draft.mtp > 0)
      fmt::print(stderr, "lode: {}; up to {} drafted tokens per step\n", sequence_->drafter().describe(), o.draft.mtp);
  }

  void run() {
    fmt::print(stderr, "lode chat: seed {}\n", params_.seed);  // --seed repeats the conversation's samples
    if (isatty(fileno(stdin)))
      fmt::print(stderr, "lode chat: thinking {}; /think on|off, /reset, /quit\n", thinking_ ? "on" : "off");
    std::string line;
    int turns = 0, failed = 0;
    while (prompt_user(), std::getline(std::cin, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // (nothing said)
      if (line[0] == '/') {
        if (!command(line)) break;
        continue;
      }
      ++turns;
      try {
        turn(line);
      } catch (const Error& e) {  // e.g. the context is full: say so and keep the chat alive
        ++failed;
        fmt::print(stderr, "\nlode: error: {}; /reset clears the conversation\n", e.what());
      }
    }
    // A chat none of whose turns was answered is a failure to a script reading the exit status.
    if (turns > 0 && failed == turns) fail("no turn of the chat was answered ({} failed)", failed);
  }

 private:
  void prompt_user() const {
    if (isatty(fileno(stdin))) fmt::print(stderr, "> ");
  }

  bool command(const std::string& line) {
    if (line == "/quit" || line == "/exit") return false;
    if (line == "/think on" || line == "/think off") {
      thinking_ = line == "/think on";
      fmt::print(stderr, "thinking {}\n", thinking_ ? "on" : "off");
    } else if (line == "/reset") {
      sequence_->reset();
      sampler_.reset();
      last_ = {};
      fmt::print(stderr, "conversation cleared\n");
    } else {
      fmt::print(stderr, "unknown command {} (try /think on, /think off, /reset, /quit)\n", line);
    }
    return true;
  }

  // The new turn's tokens: the whole rendered conversation the first time, then only what follows
  // the session's last token (closing the previous reply, the user's message, the reply's opening).
  std::vector<int32_t> turn_tokens(const std::string& user_text) {
    const auto& tok = model_.text();
    std::vector<chat::Message> messages;
    const bool first = sequence_->position() == 0 && !last_.last_token_pending;
    auto add = [&](const char* role, const std::string& content) {
      messages.emplace_back().role = role;
      messages.back().content = content;
    };
    if (first && !o_.system.empty()) add("system", o_.system);
    add("user", user_text);
    // Control tokens only where the template writes them: a line that spells <|im_end|> is text, as
    // lode serve reads a message.
    chat::RenderedChat turn =
        chat::render_qwen35_marked(messages, nullptr, {.add_generation_prompt = true, .enable_thinking = thinking_});
    std::vector<int32_t> ids;
    if (!first) {
      if (last_.last_token_pending) ids.push_back(last_.tokens.back());
      const bool closed = last_.finish == engine::FinishReason::end_of_generation &&
                          tok.token_bytes(last_.tokens.back()) == "<|im_end|>";
      const std::string close = closed ? "\n" : "<|im_end|>\n";
      turn.text = close + turn.text;
      for (TextSpan& span : turn.client) span.begin += close.size(), span.end += close.size();
    }
    const std::vector<int32_t> rest = tok.encode(turn.text, turn.client);
    ids.insert(ids.end(), rest.begin(), rest.end());
    return ids;
  }

  void turn(const std::string& user_text) {
    const std::vector<int32_t> ids = turn_tokens(user_text);
    chat::OutputParser parser(thinking_, nullptr);
    bool in_reasoning = false;
    // Reasoning shows dimmed on a terminal, between <think> tags otherwise.
    const char* open_reasoning = tty_ ? "\x1b[2m" : "<think>\n";
    const char* close_reasoning = tty_ ? "\x1b[0m\n" : "\n</think>\n";
    auto show = [&](const chat::ParsedDelta& d) {
      if (!d.reasoning.empty()) {
        if (!in_reasoning) fmt::print("{}", open_reasoning);
        in_reasoning = true;
        fmt::print("{}", d.reasoning);
      }
      if (!d.content.empty()) {
        if (in_reasoning) fmt::print("{}", close_reasoning);
        in_reasoning = false;
        fmt::print("{}", d.content);
      }
      std::fflush(stdout);
    };
    engine::GenerateOptions g;
    g.max_tokens = o_.n_predict;
    g.sampling = params_;
    g.chunk = o_.run.chunk;
    g.mtp = o_.draft.mtp;
    g.mtp_min_p = o_.draft.min_p;
    last_ = engine::generate(*sequence_, model_.text(), sampler_, ids, g,
                             [&](std::string_view piece) { show(parser.push(piece)); });
    show(parser.finish());
    if (in_reasoning) fmt::print("{}", close_reasoning);
    fmt::print("\n");
    std::fflush(stdout);
    fmt::print(stderr, "[{}; context {} tokens]\n", engine::speed_report(last_), sequence_->position());
    if (last_.finish == engine::FinishReason::context_full)
      fmt::print(stderr, "[the context of {} tokens is full: /reset starts over, --ctx makes it larger]\n",
                 sequence_->max_context());
  }

  const ChatOptions& o_;
  LoadedModel model_;
  std::unique_ptr<engine::Sequence> sequence_;  // on the CPU engine of model_, or the GPU
  sample::SamplingParams params_;
  sample::Sampler sampler_;
  bool thinking_;
  bool tty_;
  engine::GenerateResult last_;
};

}  // namespace

void add_chat_command(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  auto* cmd = app.add_subcommand("chat", "Chat with the model; one user turn per line of stdin");
  add_model_run_options(*cmd, o->run, PromptInput::none);
  add_sampling_options(*cmd, o->sampling);
  add_draft_options(*cmd, o->draft);
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens per reply at most (default 1024)")->check(integer_at_least(1));
  cmd->add_option("--system", o->system, "System prompt");
  cmd->add_flag("--no-think", o->no_think, "Start with thinking off (/think on turns it back on)");
  add_backend_options(*cmd, o->backend);
  cmd->callback([o] { Chat(*o).run(); });
}

}  // namespace lode::cli
