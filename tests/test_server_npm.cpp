// `lode serve` end to end, as users meet it: the real binary on lode-mini, driven by the official
// npm clients `openai` and `@anthropic-ai/sdk` (tools/server/e2e_*.mjs, installed by
// tools/server/fetch, which scripts/test runs). Skips, saying why, without node or the clients.
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cpu/engine.h"
#include "model/weights.h"
#include "server/server.h"
#include "support/gpu.h"
#include "support/paths.h"
#include "support/run_lode.h"
#include "test_gguf_helpers.h"
#include "test_server_support.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const fs::path kRepo = lode::test::repo_root();
const fs::path kMini = kRepo / "models/lode-mini.gguf";
const fs::path kClients = kRepo / "tools/server";
const std::string kApiKey = "lode-e2e-key";

// Why the npm end-to-end tests cannot run here, or nothing when they can.
std::optional<std::string> why_no_client(const std::string& package) {
  if (std::system("command -v node >/dev/null 2>&1") != 0) return "node is not installed (apt-get install nodejs)";
  if (!fs::exists(kClients / "node_modules" / package / "package.json"))
    return "the npm client " + package + " is not fetched: run tools/server/fetch (scripts/test does)";
  return std::nullopt;
}

// `lode serve` as a child process on a port it picks itself (--port 0), its stdout and stderr in
// `log`. The destructor stops it (SIGTERM, then SIGKILL) if a test did not.
class ServeProcess {
public:
  ServeProcess(const fs::path& log, const std::vector<std::string>& extra_args) : log_(log) {
    // One thread: ctest runs tests side by side on small machines, where a second engine thread
    // fighting for a core made a run 10x slower.
    std::vector<std::string> args = {lode::test::lode_binary(), "serve", "-m", kMini.string(), "--port", "0",
                                     "--ctx", "1024", "--threads", "1"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&files, STDOUT_FILENO, STDERR_FILENO);
    const int rc = posix_spawn(&pid_, argv[0], &files, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&files);
    if (rc != 0) pid_ = -1;
  }
  ~ServeProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  bool spawned() const { return pid_ > 0; }
  std::string log() const { return lode::test::slurp(log_); }

  // Waits for the "listening on http://HOST:PORT" line, then for GET /health to answer 200.
  // Returns the port, or 0 when the server died or did not come up within `timeout`.
  int wait_until_ready(std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    const std::regex listening(R"(listening on http://[^:\s]+:(\d+))");
    int port = 0;
    while (Clock::now() < deadline && running()) {
      std::smatch m;
      const std::string text = log();
      if (port == 0 && std::regex_search(text, m, listening)) port = std::stoi(m[1]);
      if (port != 0) {
        httplib::Client c("127.0.0.1", port);
        c.set_connection_timeout(1, 0);
        if (auto res = c.Get("/health"); res && res->status == 200) return port;
      }
      std::this_thread::sleep_for(50ms);
    }
    return 0;
  }

  // Sends SIGTERM and waits up to `timeout` for the exit: the exit code, or -1 when it did not
  // exit normally in time (then it is killed).
  int stop(std::chrono::seconds timeout) {
    ::kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + timeout;
    int status = 0;
    while (Clock::now() < deadline) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;  // the destructor kills it
  }

private:
  bool running() {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return true;
    pid_ = -1;
    return false;
  }
  fs::path log_;
  pid_t pid_ = -1;
};

struct ScriptResult {
  int status = -1;
  std::string out, err;
};

// Runs tools/server/SCRIPT against the server at `port` with the API key, for at most a minute.
ScriptResult run_script(const std::string& script, int port, const fs::path& scratch) {
  const fs::path out = scratch / (script + ".out"), err = scratch / (script + ".err");
  const std::string command = "timeout 60 node '" + (kClients / script).string() + "' http://127.0.0.1:" +
                              std::to_string(port) + " " + kApiKey + " >'" + out.string() + "' 2>'" +
                              err.string() + "'";
  const int raw = std::system(command.c_str());
  return {(raw != -1 && WIFEXITED(raw)) ? WEXITSTATUS(raw) : -1, lode::test::slurp(out), lode::test::slurp(err)};
}

// Starts `lode serve --api-key`, runs `check` with the port, then stops the server with SIGTERM,
// which must end it with exit code 0.
template <class Check>
void with_server(const lode::test::TempDir& dir, Check check) {
  ServeProcess server(dir / "serve.log", {"--api-key", kApiKey, "--backend", "cpu"});  // 4 slots, any machine
  ASSERT_TRUE(server.spawned()) << "could not start " << lode::test::lode_binary();
  const int port = server.wait_until_ready(20s);
  ASSERT_NE(port, 0) << "lode serve did not answer GET /health within 20 s; its output:\n" << server.log();
  check(port);
  EXPECT_EQ(server.stop(10s), 0) << "lode serve did not exit 0 within 10 s of SIGTERM; its output:\n" << server.log();
}

TEST(ServerNpm, OpenAIClientEndToEnd) {
  if (const auto why = why_no_client("openai")) GTEST_SKIP() << *why;
  const lode::test::TempDir dir;
  with_server(dir, [&](int port) {
    const ScriptResult r = run_script("e2e_openai.mjs", port, dir.path());
    EXPECT_EQ(r.status, 0) << "e2e_openai.mjs failed (exit code 124 would mean it ran over a minute)\nstdout: " << r.out
                           << "\nstderr: " << r.err;
    EXPECT_NE(r.out.find("\"ok\":true"), std::string::npos) << r.out;
  });
}

TEST(ServerNpm, AnthropicClientEndToEnd) {
  if (const auto why = why_no_client("@anthropic-ai/sdk")) GTEST_SKIP() << *why;
  const lode::test::TempDir dir;
  bool route_missing = false;
  with_server(dir, [&](int port) {
    // The route came in a later slice than the OpenAI ones; where this build lacks it, skip.
    httplib::Client c("127.0.0.1", port);
    auto probe = c.Post("/v1/messages", {{"x-api-key", kApiKey}}, "{}", "application/json");
    ASSERT_TRUE(probe) << "no answer to POST /v1/messages";
    if (probe->status == 404) {
      route_missing = true;
      return;
    }
    const ScriptResult r = run_script("e2e_anthropic.mjs", port, dir.path());
    EXPECT_EQ(r.status, 0) << "e2e_anthropic.mjs failed (exit code 124 would mean it ran over a minute)\nstdout: " << r.out
                           << "\nstderr: " << r.err;
    EXPECT_NE(r.out.find("\"ok\":true"), std::string::npos) << r.out;
  });
  if (route_missing) GTEST_SKIP() << "lode serve answers 404 on POST /v1/messages: this build has no Anthropic route yet";
}

// Tool calls through both clients. A small model will not call a tool on request, so the engine
// worker's fake-output hook (WorkerOptions::fake_output, never set by `lode serve`) makes the model
// "say" a fixed Qwen3.5 tool call; the server runs in-process to set it. Template, output parser,
// both response and stream formats and the clients' parsing are all real (tools/server/e2e_tools.mjs).
TEST(ServerNpm, ToolCallsThroughBothClients) {
  for (const char* package : {"openai", "@anthropic-ai/sdk"})
    if (const auto why = why_no_client(package)) GTEST_SKIP() << *why;
  const lode::test::TempDir dir;
  lode::server::ServerOptions o;
  o.port = 0;
  o.api_key = kApiKey;
  o.worker.fake_output = "The user wants the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
                         "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  auto model = std::make_shared<const lode::server::ServedModel>(kMini.string());
  auto weights = std::make_shared<const lode::model::ModelWeights>(lode::model::bind_weights(model->reader, model->config));
  lode::server::Server server(o, model, lode::cpu::CpuModel::make(weights, {.threads = 1, .max_context = 1024}));
  const int port = server.start();
  const ScriptResult r = run_script("e2e_tools.mjs", port, dir.path());
  EXPECT_EQ(r.status, 0) << "e2e_tools.mjs failed\nstdout: " << r.out << "\nstderr: " << r.err;
  EXPECT_NE(r.out.find("\"ok\":true"), std::string::npos) << r.out;
  server.stop();
}

// The load generator (tools/load/load.mjs, on the same npm client) against an in-process server:
// every request is accounted for (completed or abandoned on purpose, none failed), the replies'
// tokens are the server's count, the latencies are measured, and the abandoned streams leave no
// sequence behind.
TEST(ServerNpm, TheLoadGeneratorAccountsForEveryRequest) {
  if (const auto why = why_no_client("openai")) GTEST_SKIP() << *why;
  const lode::test::TempDir dir;
  lode::server::ServerOptions o;
  o.port = 0;
  o.worker.parallel = 4;
  auto model = std::make_shared<const lode::server::ServedModel>(kMini.string());
  auto weights = std::make_shared<const lode::model::ModelWeights>(lode::model::bind_weights(model->reader, model->config));
  lode::server::Server server(o, model, lode::cpu::CpuModel::make(weights, {.threads = 1, .max_context = 512}));
  const int port = server.start();
  const fs::path out = dir / "load.json";
  const std::string command = "timeout 120 node '" + (kRepo / "tools/load/load.mjs").string() + "' --url http://127.0.0.1:" +
                              std::to_string(port) + " --concurrency 4 --requests 10 --prompt-words 40 --max-tokens 6 " +
                              "--disconnect 0.3 --json >'" + out.string() + "' 2>&1";
  const int raw = std::system(command.c_str());
  const std::string text = lode::test::slurp(out);
  ASSERT_TRUE(raw != -1 && WIFEXITED(raw) && WEXITSTATUS(raw) == 0) << text;
  const auto report = nlohmann::json::parse(text);
  EXPECT_EQ(report["errors"], 0) << text;
  EXPECT_GE(report["abandoned"], 1) << text;  // the share is drawn from --seed 1: 3 of these 10
  EXPECT_EQ(report["completed"].get<int>() + report["abandoned"].get<int>(), 10) << text;
  EXPECT_GT(report["completion_tokens"].get<int>(), 0) << text;
  EXPECT_LE(report["completion_tokens"].get<int>(), 6 * report["completed"].get<int>()) << text;
  EXPECT_GT(report["ttft_ms"]["p50"].get<double>(), 0) << text;
  EXPECT_GT(report["itl_ms"]["p99"].get<double>(), 0) << text;
  EXPECT_GT(report["decode_tokens_per_s"].get<double>(), 0) << text;
  // Decoding is part of the wall time.
  EXPECT_GT(report["decoding_seconds"].get<double>(), 0) << text;
  EXPECT_LE(report["decoding_seconds"].get<double>(), report["seconds"].get<double>()) << text;
  EXPECT_GT(report["tokens_per_s_all_in"].get<double>(), 0) << text;
  httplib::Client status("127.0.0.1", port);
  EXPECT_TRUE(lode::test::eventually([&] {
    auto res = status.Get("/v1/status");
    return res && nlohmann::json::parse(res->body)["sequences"]["active"] == 0;
  }));
  server.stop();
}

// `lode serve --backend cuda --parallel 2`: on the GPU machine it answers on the GPU (/v1/status:
// backend cuda, two slots), two requests sent together both complete, and SIGTERM ends it with
// exit code 0; elsewhere it exits at once with a clear error.
TEST(CliServe, OnTheGpuSeveralAtOnce) {
  const lode::test::TempDir dir;
  ServeProcess server(dir / "serve.log", {"--backend", "cuda", "--parallel", "2", "--api-key", kApiKey});
  ASSERT_TRUE(server.spawned()) << "could not start " << lode::test::lode_binary();
  const int port = server.wait_until_ready(60s);
  std::string why;
  if (!lode::test::gpu_available(&why)) {
    if (lode::test::gpu_required()) ADD_FAILURE() << "LODE_REQUIRE_GPU=1, but no GPU";
    EXPECT_EQ(port, 0);
    const std::string log = server.log();
    EXPECT_TRUE(log.find("no usable NVIDIA GPU") != std::string::npos ||
                log.find("built without CUDA") != std::string::npos)
        << log;
    return;
  }
  ASSERT_NE(port, 0) << "lode serve --backend cuda did not come up; its output:\n" << server.log();
  const httplib::Headers auth{{"Authorization", std::string("Bearer ") + kApiKey}};
  const auto ask = [&](const std::string& user) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    const nlohmann::json body = {{"model", "lode-mini"},
                                 {"messages", {{{"role", "user"}, {"content", user}}}},
                                 {"max_tokens", 8},
                                 {"temperature", 0}};
    auto res = c.Post("/v1/chat/completions", auth, body.dump(), "application/json");
    return res ? std::pair{res->status, res->body} : std::pair{-1, std::string()};
  };
  std::pair<int, std::string> first, second;
  std::thread other([&] { second = ask("What is a package?"); });
  first = ask("Hello there");
  other.join();
  for (const auto& [status, body] : {first, second}) {
    ASSERT_EQ(status, 200) << body;
    const auto reply = nlohmann::json::parse(body);
    EXPECT_GT(reply["usage"]["completion_tokens"].get<int>(), 0) << body;
  }
  httplib::Client c("127.0.0.1", port);
  auto res = c.Get("/v1/status", auth);
  ASSERT_TRUE(res);
  const auto status = nlohmann::json::parse(res->body);
  EXPECT_EQ(status["backend"], "cuda") << res->body;
  EXPECT_EQ(status["sequences"]["parallel"], 2) << res->body;
  EXPECT_EQ(server.stop(10s), 0) << "lode serve did not exit 0 within 10 s of SIGTERM; its output:\n" << server.log();
}

// `lode serve --backend cuda --mtp 2 --parallel 2` drafts on the GPU (a request alone drafts): a
// greedy reply is the reply of the same server without drafts, and /metrics counts verify steps and
// accepted drafts. Skips without a GPU.
TEST(CliServe, DraftsOnTheGpuChangeNoReply) {
  LODE_REQUIRE_GPU();
  const lode::test::TempDir dir;
  const httplib::Headers auth{{"Authorization", std::string("Bearer ") + kApiKey}};
  const auto reply_of = [&](const std::vector<std::string>& args, const std::string& log, double* accepted) {
    ServeProcess server(dir / log, args);
    const int port = server.wait_until_ready(60s);
    EXPECT_NE(port, 0) << server.log();
    if (port == 0) return std::string();
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    const nlohmann::json body = {{"model", "lode-mini"},
                                 {"messages", {{{"role", "user"}, {"content", "How do I list the files in a folder?"}}}},
                                 {"max_tokens", 48},
                                 {"temperature", 0}};
    auto res = c.Post("/v1/chat/completions", auth, body.dump(), "application/json");
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : std::string("no reply"));
    if (accepted) {
      auto metrics = c.Get("/metrics", auth);
      EXPECT_TRUE(metrics);
      const std::string text = metrics ? metrics->body : std::string();
      const std::string name = "\nlode_mtp_accepted_tokens_total ";
      const size_t at = text.find(name);
      *accepted = at == std::string::npos ? -1 : std::stod(text.substr(at + name.size()));
    }
    EXPECT_EQ(server.stop(10s), 0) << server.log();
    return res && res->status == 200 ? nlohmann::json::parse(res->body)["choices"][0]["message"]["content"].get<std::string>()
                                     : std::string();
  };
  double accepted = 0;
  const std::string plain = reply_of({"--backend", "cuda", "--api-key", kApiKey}, "plain.log", nullptr);
  const std::string drafted =
      reply_of({"--backend", "cuda", "--api-key", kApiKey, "--mtp", "2", "--parallel", "2"}, "mtp.log", &accepted);
  EXPECT_FALSE(plain.empty());
  EXPECT_EQ(drafted, plain);
  EXPECT_GT(accepted, 0) << "lode-mini's drafts are sometimes right";
}

}  // namespace
