// Prefix reuse in `lode serve`: the next turn of a conversation starts from a checkpoint of the
// previous one (cached_tokens > 0) and returns exactly what a cold run of the same prompt returns;
// an unrelated request reuses nothing.
#include <algorithm>
#include <thread>
#include <utility>
#include <unordered_set>

#include "chat/output_parser.h"
#include "chat/template.h"
#include "core/error.h"
#include "cpu/engine.h"
#include "engine/generate.h"
#include "server/prefix_cache.h"
#include "support/gpu.h"
#include "test_server_support.h"

namespace lode::test {
namespace {

const std::string kSystem =
    "You are a careful assistant for Unix users. You answer questions about commands, files, "
    "processes and permissions, quoting the manual pages where you can, and you keep every answer "
    "short: one paragraph, no lists, no headings. When a question is unclear, you say so and ask "
    "for the missing detail instead of guessing. You never invent options that a command does not have.";

// The prompt the server makes of these messages.
std::vector<int32_t> prompt_of(const json& messages) {
  std::vector<chat::Message> parsed;
  for (const auto& m : messages) parsed.push_back(chat::message_from_json(nlohmann::ordered_json(m)));
  return mini_model()->tokenizer.encode(chat::render_qwen35(parsed, nullptr, {}), true);
}

// The text a fresh session generates for these messages at temperature 0 (thinking on).
std::string cold_run(const json& messages, int max_tokens, kv::Format kv_format = kv::Format::f32) {
  auto model = mini_model();
  const auto prompt = prompt_of(messages);
  cpu::Session session(model->reader, model->config, {.threads = 1, .max_context = 512, .kv_format = kv_format});
  engine::GenerateOptions g;
  g.max_tokens = max_tokens;
  g.sampling.temperature = 0;
  sample::Sampler sampler(g.sampling, session.vocab());
  std::string text;
  engine::generate(*cpu::borrow_sequence(session), model->tokenizer, sampler, prompt, g,
                   [&](std::string_view t) { text += t; });
  return text;
}

json request(const json& messages, int max_tokens) {
  return {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
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
  EXPECT_EQ(reply_text(second), parsed_text(cold_run(messages, 12)));

  // An unrelated conversation shares nothing worth a checkpoint.
  const json other = server.post_json("/v1/chat/completions",
                                      request(json::array({{{"role", "user"}, {"content", "hello"}}}), 6));
  EXPECT_EQ(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(reply_text(other), parsed_text(cold_run(json::array({{{"role", "user"}, {"content", "hello"}}}), 6)));
}

// On the Anthropic route a resumed turn counts as Anthropic counts: cache_read_input_tokens the
// prompt tokens the prefix cache held, input_tokens the rest (the prompt, count_tokens' figure, is
// their sum), in the plain reply and in a stream's message_delta.
TEST(ServerPrefix, AnthropicUsageSplitsThePromptIntoCachedAndNot) {
  TestServer server;
  json body = {{"max_tokens", 8}, {"temperature", 0}, {"system", kSystem},
               {"messages", {{{"role", "user"}, {"content", "What does chmod do?"}}}}};
  const json first = server.post_json("/v1/messages", body);
  EXPECT_EQ(first["usage"]["cache_read_input_tokens"], 0);
  body["messages"].push_back({{"role", "assistant"}, {"content", first["content"]}});
  body["messages"].push_back({{"role", "user"}, {"content", "And chown?"}});
  json counted = body;
  counted.erase("max_tokens");
  const int64_t prompt = server.post_json("/v1/messages/count_tokens", counted)["input_tokens"];
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "plain");
    body["stream"] = stream;
    json usage;
    if (stream) {
      auto res = server.post("/v1/messages", body.dump());
      ASSERT_TRUE(res);
      for (const json& e : sse_typed_events(res->body))
        if (e["type"] == "message_delta") usage = e["usage"];
    } else {
      usage = server.post_json("/v1/messages", body)["usage"];
    }
    const int64_t cached = usage["cache_read_input_tokens"];
    EXPECT_GE(cached, 64) << usage;
    EXPECT_EQ(usage["input_tokens"].get<int64_t>() + cached, prompt) << usage;
    EXPECT_EQ(usage["cache_creation_input_tokens"], 0);
  }
}

// A server that takes 16 prompt tokens a step (WorkerOptions::prompt_step) still checkpoints every
// 64 and cuts prompts at the same boundaries cold or resumed: both turns of a conversation return
// what a server taking 64 a step returns, the first turn in at least a step per 16 prompt tokens.
// (DeltaNet in its recurrent form: the chunked form's bits depend on the chunk.)
TEST(ServerPrefix, PromptsTakenAFewTokensAStepKeepTheirCheckpointsAndText) {
  server::ServerOptions small_steps, whole_chunks;
  small_steps.worker.parallel = whole_chunks.worker.parallel = 1;
  small_steps.worker.prompt_step = 16;
  TestServer a(small_steps, {.deltanet_chunk = 0}), b(whole_chunks, {.deltanet_chunk = 0});
  json messages = {{{"role", "system"}, {"content", kSystem}}, {{"role", "user"}, {"content", "What does chmod do?"}}};
  const json first = a.post_json("/v1/chat/completions", request(messages, 6));
  EXPECT_EQ(reply_text(first), reply_text(b.post_json("/v1/chat/completions", request(messages, 6))));
  const int64_t prompt_tokens = first["usage"]["prompt_tokens"];
  EXPECT_GE(a.get_json("/v1/status")["steps"]["total"].get<int64_t>(), prompt_tokens / 16);
  messages.push_back({{"role", "assistant"}, {"content", first["choices"][0]["message"]["content"]}});
  messages.push_back({{"role", "user"}, {"content", "And chown?"}});
  const json second = a.post_json("/v1/chat/completions", request(messages, 6));
  const int64_t cached = second["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, 64) << second.dump();
  EXPECT_EQ(cached % 64, 0);
  EXPECT_EQ(reply_text(second), reply_text(b.post_json("/v1/chat/completions", request(messages, 6))));
}

// A bound on all slots' checkpoint memory (WorkerOptions::checkpoint_bytes_limit): with room for
// one conversation's checkpoints, a second conversation's make the least recently used slot's go,
// so its next turn reuses nothing, while the other's next turn still does; the memory stays within
// the bound, and the replies are a cold run's either way.
TEST(ServerPrefix, CheckpointMemoryStaysWithinItsBound) {
  const json first = {{{"role", "system"}, {"content", kSystem}}, {{"role", "user"}, {"content", "What does chmod do?"}}};
  const std::string other_system =  // (nothing in common with kSystem past the template's first tokens)
      "Windows answers only: explain each PowerShell cmdlet with one example pipeline, name the module it "
      "ships in, and mention when an older cmd.exe command does the same job. Prefer aliases spelled out "
      "in full, and warn about execution policy whenever a script file is involved in the answer.";
  const json second = {{{"role", "system"}, {"content", other_system}}, {{"role", "user"}, {"content", "What does Get-ChildItem do?"}}};
  server::ServerOptions o;
  o.worker.parallel = 2;
  int64_t one = 0;  // what one conversation's checkpoints hold
  {
    TestServer unbounded(o);
    unbounded.post_json("/v1/chat/completions", request(first, 4));
    one = unbounded.get_json("/v1/status")["memory"]["prefix_checkpoint_bytes"];
  }
  ASSERT_GT(one, 0);
  o.worker.checkpoint_bytes_limit = one;
  TestServer server(o);
  server.post_json("/v1/chat/completions", request(first, 4));
  EXPECT_EQ(server.get_json("/v1/status")["memory"]["prefix_checkpoint_bytes"], one);
  server.post_json("/v1/chat/completions", request(second, 4));
  EXPECT_LE(server.get_json("/v1/status")["memory"]["prefix_checkpoint_bytes"].get<int64_t>(), one);
  const json again = server.post_json("/v1/chat/completions", request(first, 4));
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0);  // its checkpoints went
  EXPECT_EQ(reply_text(again), parsed_text(cold_run(first, 4)));
}

// A step's prompt tokens must divide the checkpoint interval.
TEST(ServerPrefix, APromptStepThatDoesNotDivideTheChunkIsRefused) {
  server::ServerOptions o;
  o.worker.prompt_step = 24;
  EXPECT_THROW(TestServer server(o), lode::Error);
}

// The options of a two-slot server and of the one-slot server whose cold runs it is held to, both
// checkpointing every `chunk` tokens.
std::pair<server::ServerOptions, server::ServerOptions> two_slots_and_one(int64_t chunk) {
  server::ServerOptions two, one;
  two.worker.parallel = 2;
  one.worker.parallel = 1;
  two.worker.chunk = one.worker.chunk = chunk;
  return {two, one};
}

// Two agents with the same long system prompt take turns on a two-slot server checkpointing every
// `chunk` tokens. The second one's first request copies the shared system prompt from the first
// one's slot into a free slot (cached: the last checkpoint inside the part the two prompts share)
// without disturbing it; each next turn then finds its earlier prompt in its own slot (cached: the
// last checkpoint inside what the earlier and the new prompt share, below the earlier one's last
// token; past what the two conversations share) and still returns the text cold(messages,
// max_tokens) gives. (The new prompt re-renders the earlier assistant turn, so the two part a few
// tokens before the earlier prompt's end: its generation prompt opens a think block.)
template <class Cold>
void interleave_two_conversations(const TestServer& server, int64_t chunk, const Cold& cold) {
  const std::string question[2] = {
      "I keep a directory of shell scripts and text notes in my home folder. What does cat do with "
      "several file names, and how would I use it to join two of my notes into a third file?",
      "My project has hundreds of files in nested folders and I want an overview of them. What does ls "
      "do with the -l and -R options, and how do I sort its listing by modification time?"};
  std::vector<json> chats(2);
  for (int c = 0; c < 2; ++c)
    chats[size_t(c)] = {{{"role", "system"}, {"content", kSystem}}, {{"role", "user"}, {"content", question[c]}}};
  const std::vector<int32_t> first = prompt_of(chats[0]), second = prompt_of(chats[1]);
  const int64_t shared = std::mismatch(first.begin(), first.end(), second.begin(), second.end()).first - first.begin();
  std::vector<int32_t> earlier[2];  // each conversation's last prompt
  for (int turn = 0; turn < 2; ++turn) {
    for (int c = 0; c < 2; ++c) {
      json& messages = chats[size_t(c)];
      const std::vector<int32_t> prompt = prompt_of(messages);
      const json reply = server.post_json("/v1/chat/completions", request(messages, 8));
      const int64_t cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"];
      const std::string what = "conversation " + std::to_string(c) + " turn " + std::to_string(turn) + ": " + reply.dump();
      if (turn == 0 && c == 0) EXPECT_EQ(cached, 0) << what;
      if (turn == 0 && c == 1) EXPECT_EQ(cached, shared / chunk * chunk) << what;  // the shared system prompt
      if (turn == 1) {  // checkpoints sit at whole chunks before a prompt's last token
        const std::vector<int32_t>& before = earlier[size_t(c)];
        const int64_t common = std::mismatch(before.begin(), before.end(), prompt.begin(), prompt.end()).first - before.begin();
        EXPECT_EQ(cached, std::min<int64_t>(common, int64_t(before.size()) - 1) / chunk * chunk) << what;
        EXPECT_GT(cached, shared / chunk * chunk) << what;
      }
      EXPECT_EQ(reply["usage"]["prompt_tokens"], int64_t(prompt.size())) << what;
      earlier[size_t(c)] = prompt;
      EXPECT_EQ(reply_text(reply), cold(messages, 8)) << what;
      const json& said = reply["choices"][0]["message"];
      json assistant = {{"role", "assistant"}, {"content", said["content"].is_string() ? said["content"] : json("")}};
      if (said.contains("reasoning_content")) assistant["reasoning_content"] = said["reasoning_content"];
      messages.push_back(assistant);
      messages.push_back({{"role", "user"}, {"content", "Tell me more."}});
    }
  }
  EXPECT_GT(server.get_json("/v1/status")["memory"]["prefix_checkpoint_bytes"], 0);
}

// In the plain fp32 cache and in k8v4 (int8 keys, rotated 4-bit values), whose copies and cuts
// move encoded rows.
class ServerPrefixFormats : public ::testing::TestWithParam<kv::Format> {};

TEST_P(ServerPrefixFormats, InterleavedConversationsEachKeepTheirCache) {
  server::ServerOptions o;
  o.worker.parallel = 2;
  TestServer server(o, {.kv_format = GetParam()});
  EXPECT_EQ(server.get_json("/v1/status")["kv_format"], kv::to_string(GetParam()));
  interleave_two_conversations(server, 64, [](const json& messages, int max_tokens) {
    return parsed_text(cold_run(messages, max_tokens, GetParam()));
  });
}

// On the GPU, where a slot's checkpoints keep its K/V pages and the second agent's copy of the
// system prompt shares the first one's pages (cuda/kv_cache.h): every turn returns what the same
// messages return on a fresh one-sequence GPU server. Checkpoints every 48 tokens, inside pages,
// so a sequence resumed from one writes into a shared page (copied on write).
TEST(ServerPrefix, GpuSlotsSharePagesAndMatchColdRuns) {
  LODE_REQUIRE_GPU();
#ifdef LODE_HAVE_CUDA
  const auto [two, one] = two_slots_and_one(48);
  TestServer server(two, gpu_mini_engine(2));
  interleave_two_conversations(server, 48, [&](const json& messages, int max_tokens) {
    const TestServer cold(one, gpu_mini_engine(1));
    return reply_text(cold.post_json("/v1/chat/completions", request(messages, max_tokens)));
  });
#endif
}

// A slot whose request is still generating lends its checkpoints: a second agent with the same
// system prompt, arriving while the first one decodes, copies the system prompt's checkpoints from
// the busy slot (the first one's K/V before them does not change as it goes on) and returns what a
// cold run returns.
TEST(ServerPrefix, ABusySlotLendsTheSystemPromptItRead) {
  server::ServerOptions o;
  o.worker.parallel = 2;
  o.worker.token_delay = std::chrono::milliseconds(10);
  TestServer server(o);
  const json first = {{{"role", "system"}, {"content", kSystem}}, {{"role", "user"}, {"content", "What does chmod do?"}}};
  const int64_t first_prompt = int64_t(prompt_of(first).size());
  std::thread decoding([&] {
    const json done = server.post_json("/v1/chat/completions", request(first, 60));
    EXPECT_EQ(done["usage"]["completion_tokens"], 60);  // it was still decoding meanwhile
  });
  // The second agent arrives once the first one decodes (its prompt took a step a chunk).
  ASSERT_TRUE(eventually([&] { return server.get_json("/v1/status")["steps"]["total"] >= first_prompt / 64 + 4; }));
  const json second = {{{"role", "system"}, {"content", kSystem}}, {{"role", "user"}, {"content", "And chown?"}}};
  const json reply = server.post_json("/v1/chat/completions", request(second, 4));
  decoding.join();
  const std::vector<int32_t> a = prompt_of(first), b = prompt_of(second);
  const int64_t shared = std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin();
  EXPECT_EQ(reply["usage"]["prompt_tokens_details"]["cached_tokens"], shared / 64 * 64) << reply.dump();
  EXPECT_EQ(reply_text(reply), parsed_text(cold_run(second, 4)));
}

// Where a prompt's turns start (the template's <|im_start|>).
std::vector<int64_t> turn_starts(const std::vector<int32_t>& prompt) {
  const int32_t turn = mini_model()->tokenizer.find_token(chat::kTurnStart).value();
  std::vector<int64_t> at;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] == turn) at.push_back(int64_t(i));
  return at;
}

// Where a step is long (the GPU's 1,024 tokens; 512 here, more than these prompts hold), prompts are
// also cut where a turn starts at least 64 tokens from other cuts and the end (server/prompt_cuts.h),
// and those cuts keep checkpoints. Two agents share a system prompt on a two-slot server: the
// second one's first request reuses the first's system prompt; a conversation's second turn reuses
// it too (its first prompt's user turn ended too close to the end to be cut), and its third turn
// reuses everything before the first reply (cut in the second prompt). Every reply, and its
// logprobs, is what a one-slot server's cold run of the same messages gives.
template <class Cold>
void share_turns_on_long_steps(const TestServer& server, const Cold& cold) {
  const std::string question[2] = {
      "I keep a directory of shell scripts and text notes in my home folder, sorted into a few "
      "folders by topic, and I often need to look at several of them at once. What does cat do with "
      "several file names, in which order does it print them, and how would I use it to join two of "
      "my notes into a third file without losing either of the originals?",
      "My project has hundreds of files in nested folders and I want an overview of them before I "
      "start cleaning up, ideally one listing I can read from top to bottom. What does ls do with the "
      "-l and -R options together, what do the columns of its long listing mean, and how do I sort "
      "its listing by modification time, newest last?"};
  const std::string follow_up =
      "Thank you. Now please explain the same thing again for a beginner who has never opened a "
      "terminal before: what the command line is, where to type the command, what the output will "
      "look like on the screen, and what could go wrong if a file name has a space in it or starts "
      "with a dash. Keep it to one short paragraph, please.";
  std::vector<json> chats(2);
  for (int c = 0; c < 2; ++c)
    chats[size_t(c)] = {{{"role", "system"}, {"content", kSystem}}, {{"role", "user"}, {"content", question[c]}}};
  for (int turn = 0; turn < 3; ++turn) {
    for (int c = 0; c < 2; ++c) {
      json& messages = chats[size_t(c)];
      const std::vector<int32_t> prompt = prompt_of(messages);
      const std::vector<int64_t> turns = turn_starts(prompt);  // system, user, (assistant, user)...
      ASSERT_EQ(turns.size(), size_t(2 * turn + 3));
      ASSERT_GE(turns[1], 64);                 // the system turn is long enough to be cut off,
      ASSERT_GE(turns[2] - turns[1], 64);      // and so is the first user turn
      ASSERT_LT(int64_t(prompt.size()), 480);  // (no multiple of the step inside: 512 positions)
      json body = request(messages, 8);
      body["logprobs"] = true;
      body["top_logprobs"] = 2;
      const json reply = server.post_json("/v1/chat/completions", body);
      const int64_t cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"];
      const std::string what = "conversation " + std::to_string(c) + " turn " + std::to_string(turn) + ": " + reply.dump();
      EXPECT_EQ(cached, turn == 0 && c == 0 ? 0 : turn < 2 ? turns[1] : turns[2]) << what;
      const json alone = cold(body);
      EXPECT_EQ(reply_text(reply), reply_text(alone)) << what;
      EXPECT_EQ(reply["choices"][0]["logprobs"], alone["choices"][0]["logprobs"]) << what;
      const json& said = reply["choices"][0]["message"];
      json assistant = {{"role", "assistant"}, {"content", said["content"].is_string() ? said["content"] : json("")}};
      if (said.contains("reasoning_content")) assistant["reasoning_content"] = said["reasoning_content"];
      messages.push_back(assistant);
      messages.push_back({{"role", "user"}, {"content", follow_up}});
    }
  }
}

TEST(ServerPrefix, LongStepsCutAtTurnsSoSystemPromptsAndEarlierTurnsAreReused) {
  const auto [two, one] = two_slots_and_one(512);
  TestServer server(two);
  share_turns_on_long_steps(server, [&](const json& body) {
    const TestServer cold(one);
    return cold.post_json("/v1/chat/completions", body);
  });
}

// The same on the GPU, whose pieces' bits depend on where they are cut.
TEST(ServerPrefix, GpuLongStepsCutAtTurnsAndMatchColdRuns) {
  LODE_REQUIRE_GPU();
#ifdef LODE_HAVE_CUDA
  const auto [two, one] = two_slots_and_one(512);
  TestServer server(two, gpu_mini_engine(2));
  share_turns_on_long_steps(server, [&](const json& body) {
    const TestServer cold(one, gpu_mini_engine(1));
    return cold.post_json("/v1/chat/completions", body);
  });
#endif
}

INSTANTIATE_TEST_SUITE_P(Kv, ServerPrefixFormats, ::testing::Values(kv::Format::f32, kv::Format::k8v4),
                         [](const auto& info) { return std::string(kv::to_string(info.param)); });

// Prefills `prompt` from `from` in whole chunks of 16 as the worker does, checkpointing at whole
// intervals before the last chunk.
void prefill_from(engine::Sequence& session, server::PrefixCache& cache, std::span<const int32_t> prompt, int64_t from) {
  for (int64_t at = from; at < int64_t(prompt.size()); at += 16) {
    const auto chunk = prompt.subspan(size_t(at), std::min<size_t>(16, prompt.size() - size_t(at)));
    engine::prefill(session, chunk, 16);
    cache.after_chunk(session, chunk, at + 16 < int64_t(prompt.size()));
  }
}

TEST(ServerPrefix, CheckpointsAreBoundedAndSitAtWholeIntervals) {
  const auto sequence = mini_engine()->open_sequence();
  engine::Sequence& session = *sequence;
  server::PrefixCache cache({.step = 16, .checkpoint_every = 16}, 3);
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(100 + i);
  EXPECT_EQ(cache.resume(session, prompt), 0);
  prefill_from(session, cache, prompt, 0);
  EXPECT_EQ(cache.checkpoints(), 3u);  // 16..96 taken, the oldest dropped
  cache.record({}, false);
  EXPECT_EQ(cache.reusable(session, prompt), 96);  // the same prompt again
  EXPECT_EQ(cache.resume(session, prompt), 96);
  EXPECT_EQ(session.position(), 96);
  prefill_from(session, cache, prompt, 96);
  prompt[70] = 7;  // diverges inside the cached part: back to the checkpoint before it (64)
  EXPECT_EQ(cache.resume(session, prompt), 64);
  EXPECT_EQ(session.position(), 64);
  // A session that someone else moved on is not trusted.
  engine::prefill(session, std::span(prompt).first(3), 16);
  EXPECT_EQ(cache.reusable(session, prompt), 0);
}

// Past the bound on a slot's checkpoints the lowest go first, but for the first at a turn (a system
// prompt's end, which other conversations share): with room for two, a prompt cut at its turn (64),
// at 128, 256 and 384 keeps 64 and 384, so a request that shares only its first 200 tokens resumes
// at 64.
TEST(ServerPrefix, TheFirstTurnsCheckpointOutlivesLaterOnesPastTheBound) {
  const auto sequence = mini_engine()->open_sequence();
  const server::PromptCuts cuts{.step = 128, .checkpoint_every = 128, .turn_start = 5};
  server::PrefixCache cache(cuts, 2);
  std::vector<int32_t> prompt(450);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(100 + i % 300);
  prompt[64] = 5;
  for (int64_t at = 0; at < int64_t(prompt.size());) {
    const int64_t end = cuts.next(prompt, at);
    const auto piece = std::span(prompt).subspan(size_t(at), size_t(end - at));
    engine::prefill(*sequence, piece, 128);
    cache.after_chunk(*sequence, piece, end < int64_t(prompt.size()) && cuts.keeps_checkpoint(end));
    at = end;
  }
  cache.record({}, false);
  EXPECT_EQ(cache.checkpoints(), 2u);
  EXPECT_EQ(cache.reusable(*sequence, prompt), 384);
  std::vector<int32_t> other = prompt;
  other[200] = 7;
  EXPECT_EQ(cache.reusable(*sequence, other), 64);
}

// A prefix copied to another slot shares the source's checkpoints: their host memory is counted
// once across the caches (what the server's --prefix-cache-mib bound and /v1/status add up).
TEST(ServerPrefix, CheckpointsTwoSlotsShareAreCountedOnce) {
  const auto engine = mini_engine();
  const auto first = engine->open_sequence(), second = engine->open_sequence();
  server::PrefixCache a({.step = 16, .checkpoint_every = 16}, 8), b({.step = 16, .checkpoint_every = 16}, 8);
  std::vector<int32_t> prompt(70);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(200 + i);
  prefill_from(*first, a, prompt, 0);
  a.record({}, false);
  ASSERT_EQ(a.checkpoints(), 4u);  // 16, 32, 48, 64
  std::unordered_set<const engine::Checkpoint*> alone;
  const int64_t a_bytes = a.bytes(alone);
  ASSERT_GT(a_bytes, 0);
  EXPECT_EQ(b.resume_from(*second, a, *first, prompt), 64);
  EXPECT_EQ(b.checkpoints(), 4u);
  std::unordered_set<const engine::Checkpoint*> seen;
  EXPECT_EQ(a.bytes(seen) + b.bytes(seen), a_bytes);  // the same four, not eight
  prefill_from(*second, b, prompt, 64);  // (its last chunk: no checkpoint of its own)
  std::unordered_set<const engine::Checkpoint*> again;
  EXPECT_EQ(b.bytes(again), a_bytes);
}

}  // namespace
}  // namespace lode::test
