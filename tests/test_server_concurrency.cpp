// Continuous batching: eight clients streaming greedy chats at once, batched together in the
// worker's steps, get exactly the text each gets alone on a one-slot server (prefix reuse between
// them must not leak one conversation into another either); a long prompt is prefilled in chunks
// beside sequences that keep decoding. On the GPU, the same streams batched in its steps get what
// each gets alone on a one-sequence GPU server.
#include <thread>

#include "support/gpu.h"
#include "test_server_support.h"


namespace lode::test {
namespace {

// The joined reasoning and content deltas of a streamed chat completion and its token count (how
// the text is cut into events depends on timing; the text and the tokens do not).
std::string streamed_text(const std::string& body) {
  std::string reasoning, content;
  int64_t completion_tokens = -1;
  for (const std::string& payload : sse_payloads(body)) {
    if (payload == "[DONE]") continue;
    const json chunk = json::parse(payload);
    if (chunk.contains("usage") && chunk["usage"].is_object()) completion_tokens = chunk["usage"]["completion_tokens"];
    if (chunk["choices"].empty()) continue;
    const json& delta = chunk["choices"][0]["delta"];
    reasoning += delta.value("reasoning_content", "");
    content += delta.value("content", "");
  }
  return reasoning + "|" + content + "|" + std::to_string(completion_tokens);
}

json streamed_request(int i) {
  const std::string question = i % 2 ? "What does the command number " + std::to_string(i) + " do?"
                                     : "Quote verse " + std::to_string(i) + " of the book.";
  return {{"messages", {{{"role", "system"}, {"content", "You answer in one sentence. Conversation " + std::to_string(i % 3)}},
                        {{"role", "user"}, {"content", question}}}},
          {"max_tokens", 10}, {"temperature", 0}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
}

// The texts of requests 0 .. n-1, one after another on a one-slot server without drafts (on
// `engine`, or the CPU's).
std::vector<std::string> solo_texts(int n, std::shared_ptr<engine::Model> engine = nullptr) {
  server::ServerOptions solo;
  solo.worker.parallel = 1;
  TestServer server(solo, engine ? engine : mini_engine());
  std::vector<std::string> texts;
  for (int i = 0; i < n; ++i) {
    auto res = server.post("/v1/chat/completions", streamed_request(i).dump());
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no response");
    texts.push_back(res ? streamed_text(res->body) : std::string());
  }
  return texts;
}

// The texts of requests 0 .. n-1 sent all at once to `server`; empty for a request that failed.
std::vector<std::string> concurrent_texts(const TestServer& server, int n) {
  std::vector<std::string> texts(static_cast<size_t>(n));
  std::vector<int> status(static_cast<size_t>(n), 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i)
    clients.emplace_back([&, i] {
      auto res = server.post("/v1/chat/completions", streamed_request(i).dump());
      if (!res) return;
      status[size_t(i)] = res->status;
      texts[size_t(i)] = streamed_text(res->body);
    });
  for (auto& c : clients) c.join();
  for (int i = 0; i < n; ++i) EXPECT_EQ(status[size_t(i)], 200) << "client " << i;
  return texts;
}

// Streams 0 .. n-1 sent at once to a CPU server of `options` get the texts each gets alone on a
// one-slot server; returns the server's /v1/status after them.
json concurrent_status_after_solo_checks(server::ServerOptions options, int n) {
  const std::vector<std::string> alone = solo_texts(n);
  TestServer server(options);
  const std::vector<std::string> together = concurrent_texts(server, n);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(together[size_t(i)], alone[size_t(i)]) << "client " << i;
    EXPECT_FALSE(alone[size_t(i)].empty());
  }
  return server.get_json("/v1/status");
}

TEST(ServerConcurrency, EightConcurrentStreamsEqualTheirSoloRuns) {
  server::ServerOptions batched;
  batched.worker.parallel = 8;
  const json worker = concurrent_status_after_solo_checks(batched, 8);
  EXPECT_GE(worker["steps"]["max_batch"], 2) << worker.dump();  // they did run together
  EXPECT_EQ(worker["sequences"]["active"], 0);
}

// With a prompt budget a step takes several sequences' prompt pieces at once (the streams arrive
// while the first step's delay holds the worker): each still gets the text it gets alone, and the
// status shows steps of several prompt pieces.
TEST(ServerConcurrency, PromptsReadTogetherEqualTheirSoloRuns) {
  server::ServerOptions batched;
  batched.worker.parallel = 6;
  batched.worker.prompt_tokens = 512;
  batched.worker.token_delay = std::chrono::milliseconds(50);
  const json status = concurrent_status_after_solo_checks(batched, 6);
  EXPECT_GE(status["steps"]["prompt_rows_max"], 2) << status.dump();
  EXPECT_EQ(status["sequences"]["active"], 0);
}

// With drafts (--mtp 3) every sequence's row of a step is a verify window of its own: four streams
// at once still get exactly what each gets alone without drafts, and drafts were accepted.
TEST(ServerConcurrency, StreamsWithDraftsEqualTheirSoloRunsWithout) {
  constexpr int kClients = 4;
  const std::vector<std::string> alone = solo_texts(kClients);
  server::ServerOptions drafted;
  drafted.worker.parallel = kClients;
  drafted.worker.mtp = 3;
  drafted.worker.token_delay = std::chrono::milliseconds(5);  // (the four overlap: windows side by side)
  TestServer server(drafted);
  const std::vector<std::string> together = concurrent_texts(server, kClients);
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(together[size_t(i)], alone[size_t(i)]) << "client " << i;
  ASSERT_TRUE(eventually([&] { return metric_value(server, "lode_mtp_verify_steps_total") > 0; }));
  EXPECT_GT(metric_value(server, "lode_mtp_accepted_tokens_total"), 0);
  const json status = server.get_json("/v1/status");
  EXPECT_GE(status["steps"]["max_batch"], 2);
  // /v1/status: the drafts over the finished requests (all four), and the verify steps' time.
  const json& mtp = status["mtp"];
  EXPECT_EQ(mtp["drafts"], 3) << status.dump();
  EXPECT_GT(mtp["windows"].get<int64_t>(), 0) << status.dump();
  EXPECT_EQ(mtp["accepted"].get<int64_t>(), metric_value(server, "lode_mtp_accepted_tokens_total")) << status.dump();
  EXPECT_GE(mtp["drafted"].get<int64_t>(), mtp["accepted"].get<int64_t>()) << status.dump();
  const double acceptance = mtp["acceptance"], per_window = mtp["tokens_per_window"];
  EXPECT_GT(acceptance, 0.0) << status.dump();
  EXPECT_LE(acceptance, 1.0) << status.dump();
  EXPECT_DOUBLE_EQ(per_window, 1.0 + double(mtp["accepted"].get<int64_t>()) / double(mtp["windows"].get<int64_t>()));
  EXPECT_GT(mtp["verify_steps"].get<int64_t>(), 0) << status.dump();
  EXPECT_GT(mtp["ms_per_verify_step"].get<double>(), 0.0) << status.dump();
  EXPECT_GE(mtp["max_sequences_per_verify_step"].get<int64_t>(), 2) << status.dump();  // windows side by side
}

// A chat request whose reply runs to max_tokens: the end tokens are banned.
json unending_request(const std::string& question, int max_tokens) {
  json bias = json::object();
  for (const char* end : {"<|im_end|>", "<|endoftext|>"})
    if (const auto id = mini_model()->tokenizer.find_token(end)) bias[std::to_string(*id)] = -100;
  return {{"messages", {{{"role", "user"}, {"content", question}}}},
          {"max_tokens", max_tokens}, {"temperature", 0}, {"logit_bias", bias}};
}

// With mtp_sequences 1 (lode serve --mtp-sequences 1) a sequence drafts only while it decodes alone: a request
// that decoded only beside another drafted nothing, the long one drafted while alone, and both get
// the replies of a server without drafts.
TEST(ServerConcurrency, DraftsOnlyWhileOneSequenceDecodes) {
  const json long_request = unending_request("Name some shell commands.", 200), short_request = streamed_request(1);
  server::ServerOptions plain_options;
  plain_options.worker.parallel = 2;
  std::string long_alone, short_alone;
  {
    TestServer plain(plain_options);
    long_alone = reply_text(plain.post_json("/v1/chat/completions", long_request));
    const auto reply = plain.post("/v1/chat/completions", short_request.dump());
    ASSERT_TRUE(reply && reply->status == 200);
    short_alone = streamed_text(reply->body);
  }
  server::ServerOptions o = plain_options;
  o.worker.mtp = 3;
  o.worker.mtp_sequences = 1;
  o.worker.token_delay = std::chrono::milliseconds(10);
  TestServer server(o);
  std::string long_text;
  std::thread long_client([&] { long_text = reply_text(server.post_json("/v1/chat/completions", long_request)); });
  ASSERT_TRUE(eventually([&] { return server.get_json("/v1/status")["steps"]["total"] >= 3; }));  // decoding alone
  const auto short_reply = server.post("/v1/chat/completions", short_request.dump());
  const json beside = server.get_json("/v1/status");
  long_client.join();
  ASSERT_TRUE(short_reply && short_reply->status == 200);
  EXPECT_EQ(streamed_text(short_reply->body), short_alone);
  EXPECT_EQ(long_text, long_alone);
  ASSERT_EQ(beside["sequences"]["active"], 1) << "the long request ended before the short one: " << beside.dump();
  EXPECT_EQ(beside["mtp"]["windows"], 0) << "the short request decoded only beside the long one" << beside.dump();
  const json after = server.get_json("/v1/status");
  EXPECT_GT(after["mtp"]["windows"].get<int64_t>(), 0) << after.dump();
  EXPECT_GT(after["mtp"]["accepted"].get<int64_t>(), 0) << after.dump();
  EXPECT_EQ(after["mtp"]["max_sequences_per_verify_step"], 1) << after.dump();
}

TEST(ServerConcurrency, LongPromptIsPrefilledBesideDecodingSequences) {
  server::ServerOptions o;
  o.worker.parallel = 2;
  o.worker.token_delay = std::chrono::milliseconds(10);
  TestServer server(o);
  std::thread decoding([&] {
    json body = streamed_request(1);
    body["max_tokens"] = 40;
    body["stream"] = false;
    const json done = server.post_json("/v1/chat/completions", body);
    EXPECT_GE(done["usage"]["completion_tokens"], 20);  // it was still decoding meanwhile
  });
  // The long prompt arrives once the other sequence is decoding.
  ASSERT_TRUE(eventually([&] { return server.get_json("/v1/status")["steps"]["total"] >= 3; }));
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += "line " + std::to_string(i) + " of a long file\n";
  const json reply = server.post_json("/v1/chat/completions",
                                      json{{"messages", {{{"role", "user"}, {"content", long_text}}}}, {"max_tokens", 2}});
  decoding.join();
  EXPECT_GT(reply["usage"]["prompt_tokens"], 256);
  const json status = server.get_json("/v1/status");
  EXPECT_GE(status["steps"]["mixed"], 2) << status.dump();  // prompt chunks ran beside decoding
  // The steps' time, and the prompt chunks' share of it with their tokens (both requests' prompts,
  // read once: nothing was cached before).
  const json& steps = status["steps"];
  EXPECT_GT(steps["prompt_seconds"].get<double>(), 0.0) << status.dump();
  EXPECT_LE(steps["prompt_seconds"].get<double>(), steps["seconds"].get<double>()) << status.dump();
  EXPECT_GE(steps["prompt_tokens"].get<int64_t>(), reply["usage"]["prompt_tokens"].get<int64_t>()) << status.dump();
}

#ifdef LODE_HAVE_CUDA
// Eight streams on a GPU server of eight sequences run in its steps together and get exactly the
// text each gets alone on a GPU server of one; prompt chunks ran beside decoding rows.
TEST(ServerConcurrency, GpuStreamsEqualTheirSoloRuns) {
  LODE_REQUIRE_GPU();
  constexpr int kClients = 8;
  const std::vector<std::string> alone = solo_texts(kClients, gpu_mini_engine(1));
  server::ServerOptions batched;
  batched.worker.parallel = kClients;
  TestServer server(batched, gpu_mini_engine(kClients));
  const std::vector<std::string> together = concurrent_texts(server, kClients);
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(together[size_t(i)], alone[size_t(i)]) << "client " << i;
    EXPECT_FALSE(alone[size_t(i)].empty());
  }
  const json status = server.get_json("/v1/status");
  EXPECT_EQ(status["backend"], "cuda") << status.dump();
  EXPECT_EQ(status["gpus"], json::array({0})) << status.dump();
  EXPECT_GE(status["steps"]["max_batch"], 2) << status.dump();  // they did run together
  EXPECT_EQ(status["sequences"]["active"], 0);
}

// With drafts on a GPU server of four sequences: four streams at once, then two requests one after
// another (in other slots), get the texts of a one-sequence GPU server without drafts, and drafts
// were accepted. With --mtp-sequences 1 a sequence drafts only while it decodes alone
// (the drafters lose track of their sequences beside others and start afresh); with 4, every
// sequence drafts, and their windows verify in one step (4 x 3 rows, the sequences' drafters each
// on its own cache of the block).
TEST(ServerConcurrency, GpuStreamsWithDraftsEqualTheirSoloRunsWithout) {
  LODE_REQUIRE_GPU();
  constexpr int kClients = 4;
  const std::vector<std::string> alone = solo_texts(kClients + 2, gpu_mini_engine(1));
  struct Drafting {
    int64_t mtp, sequences;
  };
  // (mtp 2 alone: steps of more rows than a window, 4 against 3)
  for (const Drafting d : {Drafting{3, 1}, Drafting{2, 1}, Drafting{2, kClients}}) {
    SCOPED_TRACE(fmt::format("--mtp {} --mtp-sequences {}", d.mtp, d.sequences));
    server::ServerOptions drafted;
    drafted.worker.parallel = kClients;
    drafted.worker.mtp = d.mtp;
    drafted.worker.mtp_sequences = d.sequences;
    TestServer server(drafted, gpu_mini_engine(kClients, d.mtp, d.sequences));
    const std::vector<std::string> together = concurrent_texts(server, kClients);
    for (int i = 0; i < kClients; ++i) EXPECT_EQ(together[size_t(i)], alone[size_t(i)]) << "client " << i;
    for (int i = kClients; i < kClients + 2; ++i) {
      auto res = server.post("/v1/chat/completions", streamed_request(i).dump());
      ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "no response");
      EXPECT_EQ(streamed_text(res->body), alone[size_t(i)]) << "request " << i << ", alone";
      EXPECT_FALSE(alone[size_t(i)].empty());
    }
    const json status = server.get_json("/v1/status");
    EXPECT_GT(status["mtp"]["windows"].get<int64_t>(), 0) << status.dump();
    EXPECT_GT(status["mtp"]["accepted"].get<int64_t>(), 0) << status.dump();
    const int64_t together_most = status["mtp"]["max_sequences_per_verify_step"];
    if (d.sequences == 1) EXPECT_EQ(together_most, 1) << status.dump();
    else EXPECT_GE(together_most, 2) << "several sequences' drafts in one step: " << status.dump();
  }
}
#else
TEST(ServerConcurrency, GpuStreamsNeedACudaBuild) { LODE_REQUIRE_GPU(); }
#endif

}  // namespace
}  // namespace lode::test
