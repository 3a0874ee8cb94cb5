// A bounded soak of `lode serve` (in-process, lode-mini, the real engine): 500 requests from 16
// concurrent clients over every route, random prompt lengths, token limits, temperatures and
// stream modes, one streamed request in ten abandoned mid-stream. It must end with no server
// errors (every request that was read to its end answered 200), no sequence left in a slot or in
// the queue (/v1/status), prefix checkpoints within their bound, and resident memory that stops
// growing once the slots have warmed up.
#include <fmt/format.h>

#include <atomic>
#include <random>
#include <thread>

#include "test_server_support.h"

namespace lode::test {
namespace {

constexpr int kClients = 16;
constexpr int kRequests = 500;

struct Outcome {
  std::atomic<int> ok{0}, abandoned{0}, failed{0};
  std::mutex mutex;
  std::vector<std::string> failures;
  void fail(std::string what) {
    ++failed;
    std::lock_guard lock(mutex);
    if (failures.size() < 10) failures.push_back(std::move(what));
  }
};

std::string words(std::mt19937& rng) {
  static const char* vocabulary[] = {"the", "shell", "file", "reads", "lists", "directory", "process", "user",
                                     "prints", "line", "and", "of", "a", "command", "permission", "verse"};
  std::string text;
  const int n = std::uniform_int_distribution<int>(1, 120)(rng);
  for (int i = 0; i < n; ++i) text += std::string(i ? " " : "") + vocabulary[rng() % 16];
  return text;
}

// One random request: route, body and whether to hang up after the first events.
struct Plan {
  std::string path;
  json body;
  bool leave = false;
};

Plan random_plan(std::mt19937& rng) {
  Plan p;
  const int route = int(rng() % 3);
  const int max_tokens = std::uniform_int_distribution<int>(1, 24)(rng);
  const bool stream = rng() % 2;
  const double temperature = (rng() % 3) * 0.5;
  if (route == 0) {
    p.path = "/v1/chat/completions";
    p.body = {{"messages", {{{"role", "user"}, {"content", words(rng)}}}}, {"max_tokens", max_tokens}};
  } else if (route == 1) {
    p.path = "/v1/completions";
    p.body = {{"prompt", words(rng)}, {"max_tokens", max_tokens}};
  } else {
    p.path = "/v1/messages";
    p.body = {{"model", "lode-mini"}, {"messages", {{{"role", "user"}, {"content", words(rng)}}}}, {"max_tokens", max_tokens}};
  }
  p.body["temperature"] = temperature;
  p.body["stream"] = stream;
  p.leave = stream && rng() % 5 == 0;  // 1 in 10 of all requests
  return p;
}

void run_plan(const TestServer& server, const Plan& plan, Outcome& outcome) {
  httplib::Request req = json_request(plan.path, plan.body);
  std::string received;
  if (plan.leave) {
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      received.append(data, n);
      return received.size() < 40;  // hang up after the first event or so
    };
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto res = server.client().send(req);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (plan.leave) {
    ++outcome.abandoned;
    if (res && res->status >= 500) outcome.fail(plan.path + " answered " + std::to_string(res->status));
    return;
  }
  if (!res)
    return outcome.fail(fmt::format("{} {}: no response ({}) after {:.1f} s", plan.path, plan.body.dump(),
                                    httplib::to_string(res.error()), seconds));
  if (res->status != 200) return outcome.fail(plan.path + " " + plan.body.dump() + " -> " + std::to_string(res->status) + " " + res->body);
  ++outcome.ok;
}

int64_t rss(const TestServer& server) { return server.get_json("/v1/status")["memory"]["rss_bytes"]; }

TEST(ServerSoak, FiveHundredMixedRequestsEndCleanly) {
  server::ServerOptions o;
  o.worker.parallel = 4;
  // 16 clients, but an abandoned stream holds its place until its handler notices (a quarter
  // second at most, longer on a loaded machine) while its client already sends the next request:
  // room for those, so that any 429 would be a fault.
  o.worker.max_queue = 4 * kClients;
  o.worker.checkpoints_per_slot = 8;
  TestServer server(o);
  Outcome outcome;
  std::atomic<int> next{0};
  int64_t rss_warm = 0;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c)
    clients.emplace_back([&, c] {
      std::mt19937 rng(1000 + c);
      for (int i = next++; i < kRequests; i = next++) {
        run_plan(server, random_plan(rng), outcome);
        if (i == kRequests / 5) rss_warm = rss(server);
      }
    });
  for (auto& t : clients) t.join();

  for (const auto& f : outcome.failures) ADD_FAILURE() << f;
  EXPECT_EQ(outcome.failed, 0);
  EXPECT_EQ(outcome.ok + outcome.abandoned, kRequests);
  EXPECT_GE(outcome.abandoned, kRequests / 20);
  // Abandoned streams end within a step or two of the hang-up: nothing stays in a slot or queued.
  json status;
  for (int i = 0; i < 100; ++i) {
    status = server.get_json("/v1/status");
    if (status["sequences"]["active"] == 0 && status["requests"]["active"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status["sequences"]["active"], 0) << status.dump();
  EXPECT_EQ(status["queue"]["waiting"], 0) << status.dump();
  EXPECT_EQ(status["requests"]["active"], 0) << status.dump();
  EXPECT_GE(status["steps"]["max_batch"], 2) << status.dump();
  // Memory: checkpoints within their bound (4 slots x 8), and no growth worth the name after warm-up.
  const int64_t checkpoint = status["memory"]["prefix_checkpoint_bytes"];
  const auto model = mini_model();
  const cpu::SequenceState empty(model->config, kv::Format::f32);
  const cpu::SequenceCheckpoint one{0, empty.deltanet};
  EXPECT_LE(checkpoint, 4 * 8 * one.bytes()) << status.dump();
  const int64_t growth = rss(server) - rss_warm;
  std::printf("[ soak ] %d answered, %d abandoned; resident memory %.1f MiB after warm-up, %+.1f MiB since; "
              "%lld engine steps, largest batch %lld\n",
              outcome.ok.load(), outcome.abandoned.load(), double(rss_warm) / (1 << 20), double(growth) / (1 << 20),
              (long long)status["steps"]["total"].get<int64_t>(), (long long)status["steps"]["max_batch"].get<int64_t>());
  EXPECT_LT(growth, int64_t(64) << 20);
}

}  // namespace
}  // namespace lode::test
