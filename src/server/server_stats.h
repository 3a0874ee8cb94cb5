// What a server counts while it runs, for GET /metrics (Prometheus text) and GET /v1/status:
// responses by route and status, prompt and generated tokens, the last request's prefill and
// decode speeds, and the generation requests in flight. One object owned by the Server; every
// method is thread-safe (HTTP threads and the engine worker record into it at once).
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "engine/generate.h"

namespace lode::server {

class ServerStats {
 public:
  struct Snapshot {
    std::map<std::pair<std::string, int>, int64_t> responses;  // (route, status) -> count
    int64_t responses_total = 0;
    int64_t active = 0;  // generation requests in flight (streams included)
    int64_t prompt_tokens = 0;
    int64_t generated_tokens = 0;
    double prefill_tokens_per_second = 0;  // of the last finished generation
    double decode_tokens_per_second = 0;
    int64_t cache_hits = 0;  // requests that reused a cached prefix
    int64_t mtp_windows = 0, mtp_drafted = 0, mtp_accepted = 0;  // speculative decoding (--mtp)
  };

  // One answered request (route: the route's path, or "other" for unknown paths).
  void record_response(const std::string& route, int status);
  // One finished (or cancelled) generation.
  void record_generation(const engine::GenerateResult& result);

  // Counts a generation request as active until the returned guard is destroyed; a streamed
  // response keeps it alive in its content provider, so it counts until the stream ends.
  std::shared_ptr<const void> begin_request();

  Snapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  Snapshot counts_;  // all but active
  std::shared_ptr<std::atomic<int64_t>> active_ = std::make_shared<std::atomic<int64_t>>(0);
};

// The Prometheus text exposition (version 0.0.4) of a snapshot and the current queue depth.
std::string prometheus_text(const ServerStats::Snapshot& stats, int64_t queue_depth);

// This process's resident memory in bytes (from /proc/self/statm), 0 when it cannot be read.
int64_t resident_bytes();

}  // namespace lode::server
