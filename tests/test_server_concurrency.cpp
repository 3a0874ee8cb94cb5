// Eight clients streaming greedy chats at once get exactly the text each gets alone (the worker
// runs them in turn; prefix reuse between them must not leak one conversation into another).
#include <thread>

#include "test_server_support.h"

namespace lode::test {
namespace {

// The joined reasoning and content deltas of a streamed chat completion (how the text is cut into
// events depends on timing; the text does not).
std::string streamed_text(const std::string& body) {
  std::string reasoning, content;
  for (const std::string& payload : sse_payloads(body)) {
    if (payload == "[DONE]") continue;
    const json chunk = json::parse(payload);
    if (chunk["choices"].empty()) continue;
    const json& delta = chunk["choices"][0]["delta"];
    reasoning += delta.value("reasoning_content", "");
    content += delta.value("content", "");
  }
  return reasoning + "|" + content;
}

json streamed_request(int i) {
  const std::string question = i % 2 ? "What does the command number " + std::to_string(i) + " do?"
                                     : "Quote verse " + std::to_string(i) + " of the book.";
  return {{"messages", {{{"role", "system"}, {"content", "You answer in one sentence. Conversation " + std::to_string(i % 3)}},
                        {{"role", "user"}, {"content", question}}}},
          {"max_tokens", 10}, {"temperature", 0}, {"stream", true}};
}

TEST(ServerConcurrency, EightConcurrentStreamsEqualTheirSoloRuns) {
  constexpr int kClients = 8;
  std::vector<std::string> alone(kClients), together(kClients);
  {
    TestServer server;
    for (int i = 0; i < kClients; ++i) {
      auto res = server.post("/v1/chat/completions", streamed_request(i).dump());
      ASSERT_TRUE(res);
      ASSERT_EQ(res->status, 200) << res->body;
      alone[size_t(i)] = streamed_text(res->body);
    }
  }
  TestServer server;
  std::vector<std::thread> clients;
  std::vector<int> status(kClients, 0);
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] {
      auto res = server.post("/v1/chat/completions", streamed_request(i).dump());
      if (!res) return;
      status[size_t(i)] = res->status;
      together[size_t(i)] = streamed_text(res->body);
    });
  for (auto& c : clients) c.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(status[size_t(i)], 200) << "client " << i;
    EXPECT_EQ(together[size_t(i)], alone[size_t(i)]) << "client " << i;
    EXPECT_FALSE(alone[size_t(i)].empty());
  }
}

}  // namespace
}  // namespace lode::test
