#include "server/engine_worker.h"

#include <fmt/format.h>

#include "core/error.h"
#include "server/api_error.h"

namespace lode::server {

JobStream::Event JobStream::next() {
  std::unique_lock lock(mutex_);
  ready_.wait(lock, [&] { return done_ || !text_.empty(); });
  Event event;
  event.text = std::move(text_);
  text_.clear();
  event.done = done_;
  if (done_) {
    event.result = result_;
    event.error = error_;
  }
  return event;
}

void JobStream::push_text(std::string_view text) {
  {
    std::lock_guard lock(mutex_);
    text_ += text;
  }
  ready_.notify_all();
}

void JobStream::finish(engine::GenerateResult result) {
  {
    std::lock_guard lock(mutex_);
    result_ = std::move(result);
    done_ = true;
  }
  ready_.notify_all();
}

void JobStream::fail(std::string message) {
  {
    std::lock_guard lock(mutex_);
    error_ = std::move(message);
    done_ = true;
  }
  ready_.notify_all();
}

EngineWorker::EngineWorker(const ServedModel& model, WorkerOptions options, FinishedHook on_finished)
    : model_(model), options_(std::move(options)), on_finished_(std::move(on_finished)),
      context_(options_.context > 0 ? options_.context : model.config.context_length),
      session_(model.reader, model.config, {.threads = options_.threads, .max_context = context_}),
      thread_([this] { run(); }) {}

EngineWorker::~EngineWorker() { stop(); }

int EngineWorker::waiting() const {
  std::lock_guard lock(mutex_);
  return int(queue_.size());
}

void EngineWorker::finish(const Queued& queued, engine::GenerateResult result) {
  if (on_finished_) on_finished_(result);
  queued.stream->finish(std::move(result));
}

std::shared_ptr<JobStream> EngineWorker::submit(Job job) {
  auto stream = std::make_shared<JobStream>();
  {
    std::lock_guard lock(mutex_);
    if (stopping_) throw ApiError(503, "server_error", "the server is shutting down", {}, "shutting_down");
    // A job that would find the worker idle never waits; otherwise at most max_queue may wait.
    const bool idle = !running_ && queue_.empty();
    if (!idle && int(queue_.size()) >= options_.max_queue)
      throw ApiError(429, "rate_limit_error",
                     fmt::format("the server is busy: {} requests are already waiting (--max-queue {}); retry later",
                                 queue_.size(), options_.max_queue),
                     {}, "queue_full");
    queue_.push_back({std::move(job), stream});
  }
  wake_.notify_one();
  return stream;
}

void EngineWorker::stop() {
  std::deque<Queued> abandoned;
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    abandoned.swap(queue_);
    if (running_) running_->cancel();
  }
  wake_.notify_one();
  for (auto& q : abandoned) q.stream->fail("the server is shutting down");
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void EngineWorker::run() {
  for (;;) {
    Queued queued;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      queued = std::move(queue_.front());
      queue_.pop_front();
      running_ = queued.stream;
    }
    run_job(queued);
    std::lock_guard lock(mutex_);
    running_.reset();
  }
}

void EngineWorker::run_job(Queued& queued) {
  if (queued.stream->cancelled()) return queued.stream->finish({});
  try {
    if (options_.fake_output) return run_fake(queued);
    // Start from the longest prefix this session already holds (prefix_cache.h).
    const std::span<const int32_t> prompt = queued.job.prompt;
    const PrefixCache::Start start = prefix_.prepare(session_, prompt);
    sample::Sampler sampler(queued.job.generate.sampling, session_.vocab());
    for (int32_t t : prompt.first(size_t(start.prefilled))) sampler.accept(t);  // penalties see it all
    engine::GenerateOptions g = queued.job.generate;
    g.cancel = queued.stream->cancel_flag();
    auto result = engine::generate(session_, model_.tokenizer, sampler, prompt.subspan(size_t(start.prefilled)), g,
                                   [&](std::string_view text) {
                                     queued.stream->push_text(text);
                                     if (options_.token_delay.count() > 0) std::this_thread::sleep_for(options_.token_delay);
                                   });
    prefix_.record(result.tokens, result.last_token_pending);
    result.prompt_tokens = int64_t(prompt.size());
    result.cached_tokens = start.cached;
    finish(queued, std::move(result));
  } catch (const std::exception& e) {
    prefix_.clear();
    queued.stream->fail(e.what());
  }
}

void EngineWorker::run_fake(const Queued& queued) {
  // The fake text goes out in small pieces, as a model's would, so streaming is exercised too.
  const std::string& text = *options_.fake_output;
  engine::GenerateResult result;
  result.prompt_tokens = int64_t(queued.job.prompt.size());
  result.tokens = model_.tokenizer.encode(text, /*allow_special=*/true);
  result.finish = engine::FinishReason::end_of_generation;
  for (size_t i = 0; i < text.size(); i += 5) {
    if (queued.stream->cancelled()) {
      result.finish = engine::FinishReason::cancelled;
      break;
    }
    queued.stream->push_text(std::string_view(text).substr(i, 5));
    if (options_.token_delay.count() > 0) std::this_thread::sleep_for(options_.token_delay);
  }
  finish(queued, std::move(result));
}

}  // namespace lode::server
