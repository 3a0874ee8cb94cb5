// The engine side of the server: one worker thread generates for several requests at once
// (continuous batching, EngineWorker below) from a bounded queue. A job's output travels back
// through its JobStream, which the HTTP thread reads (all at once for a plain response, piece by
// piece for a stream) and which it cancels when the client goes away.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/prefix_cache.h"
#include "engine/generate.h"
#include "engine/generation.h"
#include "sample/sampler.h"
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
    std::vector<sample::TokenLogprobs> logprobs;  // with GenerateOptions::logprobs: those of its tokens
    bool done = false;                            // true: result or error is set, no more text
    std::optional<engine::GenerateResult> result;
    std::optional<std::string> error;             // generation failed (the message)
    bool shutting_down = false;                   // the error is the server stopping (503), not the job's
  };

  // Consumer side (an HTTP thread). Blocks until there is text or the job ended.
  Event next();
  // The same, waiting at most `timeout`: nullopt when nothing came.
  std::optional<Event> next_for(std::chrono::milliseconds timeout);
  // The client went away, or the server is stopping: the worker stops at the next token.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Producer side (the worker).
  void push_text(std::string_view text, std::span<const sample::TokenLogprobs> logprobs = {});
  void finish(engine::GenerateResult result);
  void fail(std::string message);
  void fail_shutting_down();  // the server stops before the job could end
  const std::atomic<bool>* cancel_flag() const { return &cancelled_; }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::string text_;
  std::vector<sample::TokenLogprobs> logprobs_;
  bool done_ = false;
  std::optional<engine::GenerateResult> result_;
  std::optional<std::string> error_;
  bool shutting_down_ = false;
  std::atomic<bool> cancelled_{false};
};

struct WorkerOptions {
  int parallel = 4;       // sequences generated together, each in a slot that keeps its prefix
  int max_queue = 16;     // jobs that may wait for a free slot; more are refused (429)
  // The interval of a sequence's prefix checkpoints, and the prompt tokens a step takes of it
  // unless prompt_step says fewer (server/prompt_cuts.h: prompts are cut at the step's multiples
  // and at turns, which keep checkpoints too).
  int64_t chunk = 64;
  // Prompt tokens one step takes at most where fewer than `chunk` (0: chunk), so that a long
  // prompt holds up the decoding sequences for less at a time. A divisor of chunk: checkpoints sit
  // on cuts.
  int64_t prompt_step = 0;
  // Prompt tokens one step takes at most over several prefilling sequences, each its next piece
  // (cut at prompt_step as alone), slots in turn (0: one sequence's piece a step). An engine that
  // reads such rows in one pass reads its weights once for them; the decoding sequences wait for
  // them all.
  int64_t prompt_tokens = 0;
  size_t checkpoints_per_slot = 64;  // prefix checkpoints each slot keeps (bounds their memory)
  // Host memory all slots' prefix checkpoints may hold together (0: no bound past the count per
  // slot): past it, idle slots' caches go first, least recently used first, then the lowest
  // checkpoints of the slot with the most.
  int64_t checkpoint_bytes_limit = 0;
  // Speculative decoding per sequence (engine/speculative.h): a decoding sequence's row of a step
  // is its pending token and up to `mtp` drafts; 0: off. The output does not change.
  int64_t mtp = 0;
  float mtp_min_p = 0.0f;
  // With mtp: draft only in steps where at most this many sequences decode (0: any number); in the
  // others every sequence's row is its next token. For an engine whose steps hold the windows of
  // only so many sequences (the GPU's window_rows), or whose drafts run one sequence after another,
  // each costing a step of its own, so that beside many sequences they would not pay.
  int64_t mtp_sequences = 0;
  // Test hooks, never set by `lode serve`: fake_output replaces the model's output with this text
  // (tests of tool calls, which a small model will not make reliably); token_delay sleeps after
  // every engine step (or piece of fake text) so a test can keep the worker busy.
  std::optional<std::string> fake_output;
  std::chrono::milliseconds token_delay{0};
};

// The worker: one thread owns `parallel` sequence slots (a sequence of the engine each) and runs
// them in steps. Every step runs the next token of each decoding sequence plus the next prompt
// piece of one sequence still prefilling, or of several up to WorkerOptions::prompt_tokens (taking
// turns), all in one step of the engine
// (engine::Model::step), so a long prompt never freezes the others. Jobs join free slots
// between steps: the next turn of a conversation continues in the slot that holds it; any other
// job takes the least recently used free slot, copying into it the longest prefix it shares with
// any slot's conversation (a common system prompt), so conversations do not evict each other. A
// job joins once its slot can be promised K/V for its prompt and max_tokens (engine::Sequence::
// reserve: an engine whose sequences share a pool), idle slots' conversations forgotten for room;
// until then it waits at the head of the queue. A job's tokens do not depend on what it ran beside:
// every row of a batch is computed as it would be alone, and prompts are cut at the same chunk
// boundaries.
class EngineWorker {
 public:
  // Called on the worker thread with every job's result just before its stream finishes (the
  // server's statistics); may be empty.
  using FinishedHook = std::function<void(const engine::GenerateResult&)>;

  // Opens `parallel` sequences of `engine` (which runs `model`'s weights); fails, saying why, when
  // the engine cannot hold that many.
  EngineWorker(const ServedModel& model, std::shared_ptr<engine::Model> engine, WorkerOptions options,
               FinishedHook on_finished = {});
  ~EngineWorker();  // stop()
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  // Queues a job; throws ApiError 429 when max_queue jobs already wait for a slot, 503 once stopping.
  std::shared_ptr<JobStream> submit(Job job);
  // Cancels the running and queued jobs, and joins the thread. Idempotent.
  void stop();

  // Positions of the engine's shared K/V pool on free pages now (0 without a pool).
  int64_t kv_pool_free_positions() const { return engine_->kv_pool_free_positions(); }
  int64_t context() const { return context_; }
  int max_queue() const { return options_.max_queue; }
  int parallel() const { return options_.parallel; }
  int mtp() const { return options_.mtp; }
  int waiting() const;  // jobs waiting for a slot
  int active() const;   // jobs in slots
  int64_t checkpoint_bytes() const;  // memory held by the slots' prefix checkpoints
  int64_t kv_bytes() const;          // K/V the slots' sequences hold (kept for prefix reuse)
  engine::EngineInfo engine_info() const { return engine_->info(); }
  struct StepCounts {
    int64_t steps = 0;        // batched forward passes
    int64_t max_batch = 0;    // most sequences in one of them
    int64_t mixed_steps = 0;  // steps that ran a prompt chunk beside decoding sequences
    // Wall time in the engine's steps, and in those that ran a prompt chunk (which every decoding
    // sequence of the step waits for), with the prompt tokens those chunks took.
    double step_seconds = 0, prompt_step_seconds = 0;
    int64_t prompt_tokens = 0;
    int64_t max_prompt_rows = 0;  // most prompt pieces (sequences prefilling) in one step
    // With --mtp: the steps whose decoding rows verified drafts, and their wall time; the most
    // sequences' drafts one of them verified.
    int64_t verify_steps = 0;
    double verify_step_seconds = 0;
    int64_t max_verified_sequences = 0;
  };
  StepCounts step_counts() const;

 private:
  struct Queued {
    Job job;
    std::shared_ptr<JobStream> stream;
  };
  struct Running;  // a job in a slot (engine_worker.cpp)
  struct Slot {
    std::unique_ptr<engine::Sequence> sequence;
    PrefixCache prefix;
    uint64_t last_used = 0;
    std::unique_ptr<Running> running;  // null: free
  };

  void run();
  bool admit_waiting();  // moves queued jobs into free slots; false when stopping
  // Jobs admitted[from..] go back to the head of the queue, in order, to wait for room until a job
  // ends; those after the first whose clients left end now, and all fail when the server is
  // stopping meanwhile (stop() has already given up the queue).
  void wait_at_head(std::vector<Queued>& admitted, size_t from);
  // Where a job runs: a free slot, and the slot to copy its prompt's shared prefix from (if any).
  struct Placement {
    Slot* slot = nullptr;
    Slot* source = nullptr;
  };
  Placement place(std::span<const int32_t> prompt);
  // Promises the job's K/V in its slot (engine::Sequence::reserve), forgetting idle slots'
  // conversations while the pool cannot: false when the running jobs hold the rest.
  bool reserve_room(const Placement& placement, const Job& job);
  int64_t room_needed(const Job& job) const;  // positions of K/V a job may fill
  // Whether `need` positions could be promised once every idle slot's conversation is forgotten:
  // the running jobs' promises, in whole pages, leave room for it in the engine's pool.
  bool room_once_idle_forgotten(int64_t need) const;
  void count_memory();  // the slots' checkpoint and K/V bytes, for the status
  void bound_checkpoints();  // within options_.checkpoint_bytes_limit
  void start(Placement placement, Queued queued);
  void step();
  void advance(Slot& slot, const engine::StepRow& row);  // after the step: sample, or go on prefilling
  int64_t running_slots() const;   // slots with a job
  int64_t decoding_slots() const;  // of them, those past their prompts
  // The next windows of these decoding slots' sequences, their drafts asked of the engine together
  // (engine::next_windows) into each one's Running::window; where that fails, each drafts alone, a
  // failure failing its job.
  void draft_windows(std::span<Slot* const> slots);
  // A decoding sequence's row: its pending token, and with `drafting` its window (draft_windows').
  engine::StepRow decode_row(Slot& slot, bool drafting);
  void finish(Slot& slot);
  void fail_job(Slot& slot, const std::string& why);  // its stream fails, its slot is freed, forgetting its cache
  void stop_job(Slot& slot);  // the same, the server stopping under it (503: not a reply that looks whole)
  std::shared_ptr<JobStream> release(Slot& slot);  // frees a failed job's slot, forgetting its cache
  // Gives the slot's K/V promise back (reserve(0)); where the engine fails to, forgets what the
  // slot's sequence holds (not to be reused) rather than fail the job that ends. Whether it gave.
  bool let_room_go(Slot& slot);
  void run_fake(const Queued& queued);

  const ServedModel& model_;
  std::shared_ptr<engine::Model> engine_;
  WorkerOptions options_;
  PromptCuts cuts_;  // where prompts are cut, from options_ and the tokenizer
  FinishedHook on_finished_;
  int64_t context_;
  int64_t pool_positions_ = 0, page_positions_ = 1;  // the engine's shared K/V pool (EngineInfo), 0: none
  std::vector<std::unique_ptr<Slot>> slots_;  // the worker thread's, but for the counters below
  uint64_t clock_ = 0;       // for least-recently-used slot choice
  size_t prefill_turn_ = 0;  // which prefilling slot gets the next step's chunk
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Queued> queue_;
  int active_ = 0;
  int64_t checkpoint_bytes_ = 0, kv_bytes_ = 0;
  StepCounts step_counts_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after everything above is ready
};

}  // namespace lode::server
