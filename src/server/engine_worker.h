// The engine side of the server: one worker thread owns the CPU session and runs generation jobs
// one at a time from a bounded queue. A job's output travels back through its JobStream, which the
// HTTP thread reads (all at once for a plain response, piece by piece for a stream) and which it
// cancels when the client goes away. Later slices (continuous batching, prefix reuse) replace the
// inside of this worker; the JobStream contract stays.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cpu/session.h"
#include "server/prefix_cache.h"
#include "engine/generate.h"
#include "server/served_model.h"

namespace lode::server {

struct Job {
  std::vector<int32_t> prompt;
  engine::GenerateOptions generate;  // max_tokens, sampling, stop strings (cancel is set by the worker)
};

// What the worker sends back: text as it is generated, then the end (a result, or an error).
class JobStream {
 public:
  struct Event {
    std::string text;                             // everything generated since the last event
    bool done = false;                            // true: result or error is set, no more text
    std::optional<engine::GenerateResult> result;
    std::optional<std::string> error;             // generation failed (the message)
  };

  // Consumer side (an HTTP thread). Blocks until there is text or the job ended.
  Event next();
  // The client went away, or the server is stopping: the worker stops at the next token.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Producer side (the worker).
  void push_text(std::string_view text);
  void finish(engine::GenerateResult result);
  void fail(std::string message);
  const std::atomic<bool>* cancel_flag() const { return &cancelled_; }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::string text_;
  bool done_ = false;
  std::optional<engine::GenerateResult> result_;
  std::optional<std::string> error_;
  std::atomic<bool> cancelled_{false};
};

struct WorkerOptions {
  int threads = 0;        // OpenMP threads of the session; 0: all cores
  int64_t context = 0;    // positions per sequence; 0: the model's context length
  int max_queue = 16;     // jobs that may wait while one runs; more are refused (429)
  // Test hooks, never set by `lode serve`: fake_output replaces the model's output with this text
  // (tests of tool calls, which a small model will not make reliably); token_delay sleeps after
  // every piece of text so a test can keep the worker busy.
  std::optional<std::string> fake_output;
  std::chrono::milliseconds token_delay{0};
};

class EngineWorker {
 public:
  // Called on the worker thread with every job's result just before its stream finishes (the
  // server's statistics); may be empty.
  using FinishedHook = std::function<void(const engine::GenerateResult&)>;

  EngineWorker(const ServedModel& model, WorkerOptions options, FinishedHook on_finished = {});
  ~EngineWorker();  // stop()
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  // Queues a job; throws ApiError 429 when max_queue jobs already wait behind a running one,
  // 503 once stopping.
  std::shared_ptr<JobStream> submit(Job job);
  // Cancels the running job and every queued one, and joins the thread. Idempotent.
  void stop();

  int64_t context() const { return context_; }
  int max_queue() const { return options_.max_queue; }
  // Jobs waiting behind the running one.
  int waiting() const;

 private:
  struct Queued {
    Job job;
    std::shared_ptr<JobStream> stream;
  };
  void run();
  void run_job(Queued& queued);
  void run_fake(const Queued& queued);
  void finish(const Queued& queued, engine::GenerateResult result);

  const ServedModel& model_;
  WorkerOptions options_;
  FinishedHook on_finished_;
  int64_t context_;
  cpu::Session session_;  // used by the worker thread only
  PrefixCache prefix_;    // what session_ holds, for the next request; worker thread only
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Queued> queue_;
  std::shared_ptr<JobStream> running_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after everything above is ready
};

}  // namespace lode::server
