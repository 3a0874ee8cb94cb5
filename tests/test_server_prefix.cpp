// Prefix reuse in `lode serve`: the next turn of a conversation starts from a checkpoint of the
// previous one (cached_tokens > 0) and returns exactly what a cold run of the same prompt returns;
// an unrelated request reuses nothing.
#include "chat/output_parser.h"
#include "chat/template.h"
#include "cpu/session.h"
#include "engine/generate.h"
#include "server/prefix_cache.h"
#include "test_server_support.h"

namespace lode::test {
namespace {

const std::string kSystem =
    "You are a careful assistant for Unix users. You answer questions about commands, files, "
    "processes and permissions, quoting the manual pages where you can, and you keep every answer "
    "short: one paragraph, no lists, no headings. When a question is unclear, you say so and ask "
    "for the missing detail instead of guessing. You never invent options that a command does not have.";

// The text a fresh session generates for these messages at temperature 0 (thinking on).
std::string cold_run(const json& messages, int max_tokens) {
  std::vector<chat::Message> parsed;
  for (const auto& m : messages) parsed.push_back(chat::message_from_json(nlohmann::ordered_json(m)));
  auto model = mini_model();
  const auto prompt = model->tokenizer.encode(chat::render_qwen35(parsed, nullptr, {}), true);
  cpu::Session session(model->reader, model->config, {.threads = 1, .max_context = 512});
  engine::GenerateOptions g;
  g.max_tokens = max_tokens;
  g.sampling.temperature = 0;
  sample::Sampler sampler(g.sampling, session.vocab());
  std::string text;
  engine::generate(session, model->tokenizer, sampler, prompt, g, [&](std::string_view t) { text += t; });
  return text;
}

json request(const json& messages, int max_tokens) {
  return {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

std::string full_text(const json& reply) {
  const json& m = reply["choices"][0]["message"];
  const std::string reasoning = m.value("reasoning_content", "");
  const std::string content = m["content"].is_string() ? m["content"].get<std::string>() : "";
  return reasoning + "|" + content;
}

std::string parsed_text(const std::string& raw) {
  chat::OutputParser parser(true, nullptr);
  auto d = parser.push(raw);
  const auto rest = parser.finish();
  return d.reasoning + rest.reasoning + "|" + d.content + rest.content;
}

TEST(ServerPrefix, TheNextTurnReusesTheConversationAndMatchesAColdRun) {
  TestServer server;
  json messages = {{{"role", "system"}, {"content", kSystem}}, {{"role", "user"}, {"content", "What does chmod do?"}}};
  const json first = server.post_json("/v1/chat/completions", request(messages, 12));
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  const json& said = first["choices"][0]["message"];
  json assistant = {{"role", "assistant"}, {"content", said["content"].is_string() ? said["content"] : json("")}};
  if (said.contains("reasoning_content")) assistant["reasoning_content"] = said["reasoning_content"];
  messages.push_back(assistant);
  messages.push_back({{"role", "user"}, {"content", "And chown?"}});
  const json second = server.post_json("/v1/chat/completions", request(messages, 12));
  const int64_t cached = second["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, 64) << second.dump();
  EXPECT_EQ(cached % 64, 0);
  EXPECT_LT(cached, second["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(full_text(second), parsed_text(cold_run(messages, 12)));

  // An unrelated conversation shares nothing worth a checkpoint.
  const json other = server.post_json("/v1/chat/completions",
                                      request(json::array({{{"role", "user"}, {"content", "hello"}}}), 6));
  EXPECT_EQ(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(full_text(other), parsed_text(cold_run(json::array({{{"role", "user"}, {"content", "hello"}}}), 6)));
}

TEST(ServerPrefix, CheckpointsAreBoundedAndSitAtWholeIntervals) {
  auto model = mini_model();
  cpu::Session session(model->reader, model->config, {.threads = 1, .max_context = 512});
  server::PrefixCache cache(16, 3);
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(100 + i);
  const auto a = cache.prepare(session, prompt);
  EXPECT_EQ(a.cached, 0);
  EXPECT_EQ(a.prefilled, 96);       // whole intervals of 16 before the last token
  EXPECT_EQ(cache.checkpoints(), 3u);  // 16..96 taken, the oldest dropped
  session.prefill(std::span(prompt).subspan(96));
  cache.record({}, false);
  const auto b = cache.prepare(session, prompt);  // the same prompt again
  EXPECT_EQ(b.cached, 96);
  EXPECT_EQ(session.position(), 96);
  prompt[70] = 7;  // diverges inside the cached part: back to the checkpoint before it (64)
  session.prefill(std::span(prompt).subspan(96));
  cache.record({}, false);
  const auto c = cache.prepare(session, prompt);
  EXPECT_EQ(c.cached, 64);
}

}  // namespace
}  // namespace lode::test
