#include "server/server_stats.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>

namespace lode::server {

void ServerStats::record_response(const std::string& route, int status) {
  std::lock_guard lock(mutex_);
  ++counts_.responses[{route, status}];
  ++counts_.responses_total;
}

void ServerStats::record_generation(const engine::GenerateResult& r) {
  std::lock_guard lock(mutex_);
  const int64_t generated = int64_t(r.tokens.size());
  counts_.prompt_tokens += r.prompt_tokens;
  counts_.generated_tokens += generated;
  counts_.cache_hits += r.cached_tokens > 0;
  counts_.mtp_windows += r.windows;
  counts_.mtp_drafted += r.drafted;
  counts_.mtp_accepted += r.accepted;
  counts_.prefill_tokens_per_second = r.prefill_seconds > 0 ? double(r.prompt_tokens) / r.prefill_seconds : 0;
  // decode_seconds covers the steps after the first token.
  counts_.decode_tokens_per_second = r.decode_seconds > 0 && generated > 1 ? double(generated - 1) / r.decode_seconds : 0;
}

std::shared_ptr<const void> ServerStats::begin_request() {
  // The guard holds the counter itself, so it may outlive this object (a response still being
  // torn down while the server goes away).
  auto active = active_;
  ++*active;
  return std::shared_ptr<const void>(nullptr, [active](const void*) { --*active; });
}

ServerStats::Snapshot ServerStats::snapshot() const {
  std::lock_guard lock(mutex_);
  Snapshot s = counts_;
  s.active = active_->load();
  return s;
}

namespace {

void metric(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// Label values escape backslash, quote and newline.
std::string label_value(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

// One unlabelled metric: its HELP and TYPE lines, then its value.
template <class Value>
void sample(std::string& out, const char* name, const char* type, const char* help, Value value) {
  metric(out, name, type, help);
  out += fmt::format("{} {}\n", name, value);
}

}  // namespace

std::string prometheus_text(const ServerStats::Snapshot& s, int64_t queue_depth) {
  std::string out;
  metric(out, "lode_requests_total", "counter", "HTTP requests answered, by route and status.");
  for (const auto& [key, count] : s.responses)
    out += fmt::format("lode_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", label_value(key.first), key.second, count);
  sample(out, "lode_prompt_tokens_total", "counter", "Prompt tokens processed.", s.prompt_tokens);
  sample(out, "lode_generated_tokens_total", "counter", "Tokens generated.", s.generated_tokens);
  sample(out, "lode_prefill_tokens_per_second", "gauge", "Prompt processing speed of the last request.", s.prefill_tokens_per_second);
  sample(out, "lode_decode_tokens_per_second", "gauge", "Generation speed of the last request.", s.decode_tokens_per_second);
  sample(out, "lode_queue_depth", "gauge", "Requests waiting for the engine.", queue_depth);
  sample(out, "lode_active_requests", "gauge", "Generation requests in flight.", s.active);
  sample(out, "lode_cache_hits_total", "counter", "Requests that reused a cached prefix.", s.cache_hits);
  sample(out, "lode_mtp_verify_steps_total", "counter", "Speculative verify steps (--mtp).", s.mtp_windows);
  sample(out, "lode_mtp_drafted_tokens_total", "counter", "Tokens drafted by the MTP block.", s.mtp_drafted);
  sample(out, "lode_mtp_accepted_tokens_total", "counter", "Drafted tokens the model accepted.", s.mtp_accepted);
  return out;
}

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * int64_t(sysconf(_SC_PAGESIZE));
}

}  // namespace lode::server
