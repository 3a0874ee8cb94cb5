// GET /v1/status and GET /metrics of an in-process `lode serve`: the status fields, request counts,
// `active` back to 0 after plain, streamed and abandoned requests, and /metrics as well-formed
// Prometheus text whose counters follow the requests made.
#include <atomic>
#include <regex>
#include <set>
#include <thread>

#include "test_server_support.h"

namespace lode::test {
namespace {

json get_json(const TestServer& s, const char* path) {
  auto res = s.client().Get(path);
  EXPECT_TRUE(res);
  if (!res) return {};
  EXPECT_EQ(res->status, 200) << res->body;
  return json::parse(res->body);
}

TEST(ServerStatus, StatusFieldsAndActiveBackToZero) {
  server::ServerOptions o;
  o.worker.token_delay = std::chrono::milliseconds(30);
  o.worker.max_queue = 5;
  TestServer s(o);
  const json status = get_json(s, "/v1/status");
  EXPECT_EQ(status["model"], "lode-mini");
  EXPECT_EQ(status["context"], 512);
  EXPECT_EQ(status["threads"], 1);
  EXPECT_EQ(status["gpus"], json::array());  // (the CPU engine)
  EXPECT_EQ(status["queue"], json({{"waiting", 0}, {"max", 5}}));
  EXPECT_EQ(status["requests"]["active"], 0);
  EXPECT_EQ(status["requests"]["total"], 0);  // this request is counted once answered
  EXPECT_GT(status["memory"]["rss_bytes"].get<int64_t>(), 1 << 20);
  EXPECT_EQ(status["memory"]["kv_bytes"], 0);
  EXPECT_EQ(status["kv_format"], "fp32");
  ASSERT_TRUE(status["formats"].is_array());
  const std::string embd_type = mini_model()->reader.tensor("token_embd.weight").type->name;
  EXPECT_NE(std::find(status["formats"].begin(), status["formats"].end(), embd_type), status["formats"].end())
      << status["formats"].dump() << " lacks " << embd_type;

  // Plain, streamed, Anthropic, and a stream abandoned after its first events.
  const json completion = {{"prompt", "The shell"}, {"max_tokens", 3}, {"temperature", 0}};
  s.post_json("/v1/completions", completion);
  json streamed = completion;
  streamed["stream"] = true;
  ASSERT_TRUE(s.post("/v1/completions", streamed.dump()));
  s.post_json("/v1/messages", {{"max_tokens", 3}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  stream_then_leave(s, "/v1/messages",
                    {{"max_tokens", 300}, {"stream", true}, {"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}}}, 3);
  // Five requests answered before this one (the first status call included). The abandoned
  // stream ends at the next step (the counters of a response are recorded just after it went out).
  EXPECT_TRUE(eventually([&] { return get_json(s, "/v1/status")["requests"]["active"] == 0; }));
  const json after = get_json(s, "/v1/status");
  EXPECT_EQ(after["requests"]["active"], 0);
  EXPECT_GE(after["requests"]["total"].get<int64_t>(), 5);
  EXPECT_EQ(after["queue"]["waiting"], 0);
  // The slots keep their K/V for prefix reuse: whole fp32 positions of lode-mini's 2 attention
  // layers (4096 bytes per cell each).
  const int64_t kv_bytes = after["memory"]["kv_bytes"];
  EXPECT_GT(kv_bytes, 0) << after.dump();
  EXPECT_EQ(kv_bytes % (2 * 4096), 0) << after.dump();
}

// One sample line: name, labels, value.
struct Sample {
  std::string name, labels;
  double value = 0;
};

std::vector<Sample> parse_prometheus(const std::string& text) {
  static const std::regex sample_line(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.eE+-]+|NaN|\+Inf|-Inf)$)");
  static const std::regex type_line(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  std::vector<Sample> out;
  std::set<std::string> typed;
  size_t pos = 0;
  EXPECT_TRUE(!text.empty() && text.back() == '\n');
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end - pos);
    pos = end == std::string::npos ? text.size() : end + 1;
    std::smatch m;
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (std::regex_match(line, m, type_line)) {
      EXPECT_TRUE(typed.insert(m[1]).second) << "TYPE twice: " << line;
      continue;
    }
    EXPECT_TRUE(std::regex_match(line, m, sample_line)) << "not a sample: " << line;
    if (m.empty()) continue;
    EXPECT_TRUE(typed.count(m[1])) << "no TYPE before " << line;
    out.push_back({m[1], m[2], std::stod(m[3])});
  }
  return out;
}

double value_of(const std::vector<Sample>& samples, const std::string& name, const std::string& labels = "") {
  for (const Sample& s : samples)
    if (s.name == name && s.labels == labels) return s.value;
  return -1;  // absent
}

TEST(ServerStatus, MetricsParseAndCountRequests) {
  TestServer s;
  auto metrics = [&] {
    auto res = s.client().Get("/metrics");
    EXPECT_TRUE(res);
    if (!res) return std::vector<Sample>{};
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->get_header_value("Content-Type").rfind("text/plain", 0), 0u);
    return parse_prometheus(res->body);
  };
  const auto before = metrics();
  EXPECT_EQ(value_of(before, "lode_prompt_tokens_total"), 0);
  EXPECT_EQ(value_of(before, "lode_generated_tokens_total"), 0);
  EXPECT_EQ(value_of(before, "lode_queue_depth"), 0);
  EXPECT_EQ(value_of(before, "lode_cache_hits_total"), 0);

  int64_t prompt = 0, generated = 0;
  for (int i = 0; i < 3; ++i) {
    const json reply = s.post_json("/v1/completions", {{"prompt", "The ls command"}, {"max_tokens", 4 + i}, {"temperature", 0}});
    prompt += reply["usage"]["prompt_tokens"].get<int64_t>();
    generated += reply["usage"]["completion_tokens"].get<int64_t>();
  }
  const json message = s.post_json("/v1/messages", {{"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  prompt += message["usage"]["input_tokens"].get<int64_t>() + message["usage"]["cache_read_input_tokens"].get<int64_t>();
  generated += message["usage"]["output_tokens"].get<int64_t>();
  s.post_json("/v1/messages", {{"messages", 1}}, 400);
  s.post_json("/v1/nothing", json::object(), 404);
  EXPECT_EQ(s.client().Get("/v1/models/gpt-4o")->status, 404);  // a model by name: its route's label, not "other"

  const std::string completions = R"({route="/v1/completions",status="200"})";
  std::vector<Sample> after;
  // A request is counted once its response has gone out, on its own HTTP thread, which may be after
  // the client already sent the next one: wait until every one is in.
  EXPECT_TRUE(eventually([&] {
    after = metrics();
    return value_of(after, "lode_requests_total", R"({route="other",status="404"})") == 1 &&
           value_of(after, "lode_requests_total", R"({route="/v1/models/:id",status="404"})") == 1 &&
           value_of(after, "lode_requests_total", completions) == 3 &&
           value_of(after, "lode_requests_total", R"({route="/v1/messages",status="200"})") == 1 &&
           value_of(after, "lode_requests_total", R"({route="/v1/messages",status="400"})") == 1;
  }));
  EXPECT_EQ(value_of(after, "lode_requests_total", completions), 3);
  EXPECT_EQ(value_of(after, "lode_requests_total", R"({route="other",status="404"})"), 1);
  EXPECT_EQ(value_of(after, "lode_requests_total", R"({route="/v1/models/:id",status="404"})"), 1);
  EXPECT_EQ(value_of(after, "lode_requests_total", R"({route="/v1/messages",status="200"})"), 1);
  EXPECT_EQ(value_of(after, "lode_requests_total", R"({route="/v1/messages",status="400"})"), 1);
  EXPECT_GE(value_of(after, "lode_requests_total", R"({route="/metrics",status="200"})"), 1);  // earlier scrapes
  EXPECT_EQ(value_of(after, "lode_prompt_tokens_total"), prompt);
  EXPECT_EQ(value_of(after, "lode_generated_tokens_total"), generated);
  EXPECT_GT(value_of(after, "lode_prefill_tokens_per_second"), 0);
  EXPECT_GT(value_of(after, "lode_decode_tokens_per_second"), 0);
  EXPECT_EQ(value_of(after, "lode_queue_depth"), 0);
  EXPECT_EQ(value_of(after, "lode_cache_hits_total"), 0);
}

}  // namespace
}  // namespace lode::test
