#include "server/engine_worker.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <unordered_set>

#include "chat/template.h"
#include "core/error.h"
#include "core/utf8.h"
#include "engine/speculative.h"
#include "server/api_error.h"

namespace lode::server {

JobStream::Event JobStream::next() {
  std::optional<Event> event;
  while (!(event = next_for(std::chrono::hours(1)))) {}
  return std::move(*event);
}

std::optional<JobStream::Event> JobStream::next_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return done_ || !text_.empty(); })) return std::nullopt;
  Event event;
  event.text = std::move(text_);
  text_.clear();
  event.logprobs = std::move(logprobs_);
  logprobs_.clear();
  event.done = done_;
  if (done_) {
    event.result = result_;
    event.error = error_;
    event.shutting_down = shutting_down_;
  }
  return event;
}

void JobStream::push_text(std::string_view text, std::span<const sample::TokenLogprobs> logprobs) {
  {
    std::lock_guard lock(mutex_);
    text_ += text;
    logprobs_.insert(logprobs_.end(), logprobs.begin(), logprobs.end());
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

void JobStream::fail_shutting_down() {
  {
    std::lock_guard lock(mutex_);
    shutting_down_ = true;
  }
  fail("the server is shutting down");
}

struct EngineWorker::Running {
  Queued queued;
  engine::GenerateOptions options;  // the job's, cancel wired to its stream
  sample::Sampler sampler;
  std::unique_ptr<engine::Generation> generation;
  int64_t cached = 0;     // prompt tokens reused from the slot's prefix
  int64_t prefilled = 0;  // prompt tokens in the sequence
  std::optional<int32_t> pending;  // the sampled token to run next
  size_t logprobs_sent = 0;        // logprobs entries streamed
  std::vector<int32_t> top_aside;  // this step's ids its top candidates set aside (the row points here)
  // With drafts: this step's window (pending, then drafts; empty where the step's row is the
  // pending token alone, not a window), the checkpoint before it, the counts.
  std::vector<int32_t> window;
  std::shared_ptr<const engine::Checkpoint> before;
  engine::WindowCounts counts;

  Running(Queued q, int64_t vocab, const WorkerOptions& worker)
      : queued(std::move(q)), options(queued.job.generate), sampler(options.sampling, vocab) {
    options.cancel = queued.stream->cancel_flag();
    options.mtp = worker.mtp;
    options.mtp_min_p = worker.mtp_min_p;
  }
  std::span<const int32_t> prompt() const { return queued.job.prompt; }
  bool prefilling() const { return prefilled < int64_t(queued.job.prompt.size()); }
};

EngineWorker::EngineWorker(const ServedModel& model, std::shared_ptr<engine::Model> engine, WorkerOptions options,
                           FinishedHook on_finished)
    : model_(model), engine_(std::move(engine)), options_(std::move(options)), on_finished_(std::move(on_finished)) {
  if (options_.parallel < 1) fail("--parallel must be at least 1, got {}", options_.parallel);
  if (options_.chunk < 1) fail("the prefill chunk must be at least 1 token, got {}", options_.chunk);
  if (options_.prompt_step < 0 || (options_.prompt_step > 0 && options_.chunk % options_.prompt_step != 0))
    fail("the prompt tokens a step takes ({}) must divide the prefill chunk ({})", options_.prompt_step, options_.chunk);
  if (options_.prompt_tokens < 0)
    fail("the prompt tokens a step takes over several sequences must be 0 or more, got {}", options_.prompt_tokens);
  cuts_ = {.step = options_.prompt_step > 0 ? options_.prompt_step : options_.chunk,
           .checkpoint_every = options_.chunk,
           .turn_start = model_.tokenizer.find_token(chat::kTurnStart).value_or(-1)};
  for (int i = 0; i < options_.parallel; ++i)
    slots_.push_back(std::make_unique<Slot>(
        Slot{engine_->open_sequence(), PrefixCache(cuts_, options_.checkpoints_per_slot), 0, nullptr}));
  // A request may fill no more than one sequence's context, nor more than a shared pool holds.
  context_ = slots_.front()->sequence->max_context();
  const engine::EngineInfo info = engine_->info();
  pool_positions_ = info.kv_pool_positions, page_positions_ = std::max<int64_t>(info.kv_page_positions, 1);
  if (pool_positions_ > 0) context_ = std::min(context_, pool_positions_);
  if (options_.mtp > 0)  // a model without an MTP block is refused now, not at the first request
    for (auto& slot : slots_) slot->sequence->drafter();
  thread_ = std::thread([this] { run(); });
}

EngineWorker::~EngineWorker() { stop(); }

int EngineWorker::waiting() const {
  std::lock_guard lock(mutex_);
  return int(queue_.size());
}

int EngineWorker::active() const {
  std::lock_guard lock(mutex_);
  return active_;
}

int64_t EngineWorker::kv_bytes() const {
  std::lock_guard lock(mutex_);
  return kv_bytes_;
}

int64_t EngineWorker::checkpoint_bytes() const {
  std::lock_guard lock(mutex_);
  return checkpoint_bytes_;
}

EngineWorker::StepCounts EngineWorker::step_counts() const {
  std::lock_guard lock(mutex_);
  return step_counts_;
}

std::shared_ptr<JobStream> EngineWorker::submit(Job job) {
  auto stream = std::make_shared<JobStream>();
  std::vector<Queued> abandoned;  // queued jobs whose clients left: they do not hold a place
  std::optional<ApiError> refused;
  {
    std::lock_guard lock(mutex_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (!it->stream->cancelled()) {
        ++it;
        continue;
      }
      abandoned.push_back(std::move(*it));
      it = queue_.erase(it);
    }
    // A job that finds a free slot never waits; otherwise at most max_queue wait beyond the slots.
    // Queued jobs the worker has not taken into free slots yet count as in them (18 requests at
    // once to an idle server of 2 slots and a queue of 16 refused one).
    const int waiting = active_ + int(queue_.size()) - options_.parallel;
    if (stopping_) {
      refused = ApiError(503, "server_error", "the server is shutting down", {}, "shutting_down");
    } else if (waiting >= options_.max_queue) {
      refused = ApiError(429, "rate_limit_error",
                         fmt::format("the server is busy: {} requests are already waiting (--max-queue {}); retry later",
                                     waiting, options_.max_queue),
                         {}, "queue_full");
    } else {
      queue_.push_back({std::move(job), stream});
    }
  }
  for (Queued& q : abandoned) q.stream->finish({});
  if (refused) throw *refused;
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
  }
  wake_.notify_one();
  for (auto& q : abandoned) q.stream->fail_shutting_down();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void EngineWorker::run() {
  while (admit_waiting()) step();
  // Stopping: the sequences still running end, their clients told that the server stopped.
  for (auto& slot : slots_)
    if (slot->running) stop_job(*slot);
}

bool EngineWorker::admit_waiting() {
  std::vector<Queued> admitted;
  {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || active_ > 0; });
    if (stopping_) return false;
    while (!queue_.empty() && active_ < options_.parallel) {
      admitted.push_back(std::move(queue_.front()));
      queue_.pop_front();
      ++active_;
    }
  }
  for (size_t i = 0; i < admitted.size(); ++i) {
    Queued& queued = admitted[i];
    const auto give_back_place = [&] {
      std::lock_guard lock(mutex_);
      --active_;
    };
    if (queued.stream->cancelled()) {  // a client that left while it waited holds no place
      give_back_place();
      queued.stream->finish({});
      continue;
    }
    Placement placement;
    bool room = false;
    try {
      placement = place(queued.job.prompt);  // before the job moves into start()
      room = reserve_room(placement, queued.job);
    } catch (const std::exception& e) {
      give_back_place();
      queued.stream->fail(e.what());
      continue;
    }
    if (room) {
      start(placement, std::move(queued));
      continue;
    }
    if (std::none_of(slots_.begin(), slots_.end(), [](const auto& slot) { return slot->running != nullptr; })) {
      give_back_place();  // nothing will give room back (the engine refused what its pool should hold)
      queued.stream->fail(fmt::format("the engine cannot promise the {} positions of K/V this request needs, though "
                                      "nothing else is running", room_needed(queued.job)));
      continue;
    }
    wait_at_head(admitted, i);
    break;
  }
  return true;
}

void EngineWorker::wait_at_head(std::vector<Queued>& admitted, size_t from) {
  std::vector<Queued> waiting;
  for (size_t j = from; j < admitted.size(); ++j) {
    if (j > from && admitted[j].stream->cancelled()) {  // (their clients left: no place to keep)
      {
        std::lock_guard lock(mutex_);
        --active_;
      }
      admitted[j].stream->finish({});
      continue;
    }
    waiting.push_back(std::move(admitted[j]));
  }
  {
    std::lock_guard lock(mutex_);
    active_ -= int(waiting.size());
    if (!stopping_) {
      for (size_t j = waiting.size(); j-- > 0;) queue_.push_front(std::move(waiting[j]));
      waiting.clear();
    }
  }
  for (Queued& q : waiting) q.stream->fail_shutting_down();
}

int64_t EngineWorker::room_needed(const Job& job) const {
  // (a verify window's drafts stay within max_tokens: engine::next_window)
  return std::min(context_, int64_t(job.prompt.size()) + job.generate.max_tokens);
}

bool EngineWorker::room_once_idle_forgotten(int64_t need) const {
  if (pool_positions_ <= 0) return true;
  const auto pages = [&](int64_t positions) { return (positions + page_positions_ - 1) / page_positions_; };
  int64_t promised = pages(need);  // the running jobs' promises, and what they write stays within them
  for (const auto& slot : slots_)
    if (slot->running) promised += pages(room_needed(slot->running->queued.job));
  return promised <= pages(pool_positions_);
}

bool EngineWorker::reserve_room(const Placement& placement, const Job& job) {
  const int64_t need = room_needed(job);
  engine::Sequence& sequence = *placement.slot->sequence;
  if (sequence.reserve(need)) return true;
  if (!room_once_idle_forgotten(need)) return false;  // the running jobs hold the rest: wait, forget nothing
  // A job that continues the conversation in its slot goes back to the checkpoint it resumes from
  // (start() would), giving back the old turn's tail; if that is not enough, idle slots'
  // conversations make room: the job's own slot first unless it continues there (its pages go
  // anyway), then the least recently used, then the one it copies a prefix from, then its own.
  const bool continues = !placement.source && placement.slot->prefix.reusable(sequence, job.prompt) > 0;
  if (continues) {
    placement.slot->prefix.resume(sequence, job.prompt);
    if (sequence.reserve(need)) return true;
  }
  std::vector<Slot*> order;
  for (auto& slot : slots_)
    if (!slot->running && slot.get() != placement.slot && slot.get() != placement.source) order.push_back(slot.get());
  std::sort(order.begin(), order.end(), [](const Slot* a, const Slot* b) { return a->last_used < b->last_used; });
  if (placement.source && !placement.source->running) order.push_back(placement.source);
  order.insert(continues ? order.end() : order.begin(), placement.slot);
  const auto forget_until_room = [&] {
    for (Slot* slot : order) {
      slot->prefix.clear();
      slot->sequence->reset();
      if (sequence.reserve(need)) return true;
    }
    return false;
  };
  const bool room = forget_until_room();
  count_memory();
  return room;
}

void EngineWorker::bound_checkpoints() {
  const auto total = [&] {  // (a checkpoint that slots share counted once)
    std::unordered_set<const engine::Checkpoint*> seen;
    int64_t bytes = 0;
    for (const auto& slot : slots_) bytes += slot->prefix.bytes(seen);
    return bytes;
  };
  if (total() <= options_.checkpoint_bytes_limit) return;
  std::vector<Slot*> idle;
  for (auto& slot : slots_)
    if (!slot->running && slot->prefix.checkpoints() > 0) idle.push_back(slot.get());
  std::sort(idle.begin(), idle.end(), [](const Slot* a, const Slot* b) { return a->last_used < b->last_used; });
  for (Slot* slot : idle) {
    slot->prefix.clear();
    if (total() <= options_.checkpoint_bytes_limit) return count_memory();
  }
  for (;;) {  // the running slots' lowest checkpoints, the slot with the most first
    Slot* most = nullptr;
    for (auto& slot : slots_)
      if (!most || slot->prefix.checkpoints() > most->prefix.checkpoints()) most = slot.get();
    if (!most || !most->prefix.drop_oldest() || total() <= options_.checkpoint_bytes_limit) break;
  }
  count_memory();
}

void EngineWorker::count_memory() {
  int64_t bytes = 0, kv = 0;
  std::unordered_set<const engine::Checkpoint*> seen;  // (a checkpoint that slots share counted once)
  for (const auto& s : slots_) bytes += s->prefix.bytes(seen), kv += s->sequence->kv_bytes();
  std::lock_guard lock(mutex_);
  checkpoint_bytes_ = bytes;
  kv_bytes_ = kv;
}

EngineWorker::Placement EngineWorker::place(std::span<const int32_t> prompt) {
  // The slot holding the longest reusable prefix, among all (a busy one can still lend it).
  Slot* source = nullptr;
  int64_t best = 0;
  for (auto& slot : slots_) {
    const int64_t reuse = slot->prefix.reusable(*slot->sequence, prompt, slot->running != nullptr);
    if (reuse > best) {
      source = slot.get();
      best = reuse;
    }
  }
  // The next turn of that slot's conversation continues in it (when free). Otherwise the request
  // takes the least recently used free slot and copies the shared prefix into it, so a new agent
  // sharing only a system prompt does not evict another's conversation.
  if (source && !source->running && 2 * best >= source->prefix.held()) return {source, nullptr};
  Slot* target = nullptr;
  for (auto& slot : slots_) {
    if (!slot->running && (!target || slot->last_used < target->last_used)) target = slot.get();
  }
  return {target, source == target ? nullptr : source};  // admit_waiting admits no more than the free slots
}

void EngineWorker::start(Placement placement, Queued queued) {
  Slot& slot = *placement.slot;
  const auto done_early = [&] {
    let_room_go(slot);
    std::lock_guard lock(mutex_);
    --active_;
  };
  if (queued.stream->cancelled()) {
    done_early();
    return queued.stream->finish({});
  }
  if (options_.fake_output) {
    run_fake(queued);
    return done_early();
  }
  const std::shared_ptr<JobStream> stream = queued.stream;
  try {
    auto seq = std::make_unique<Running>(std::move(queued), engine_->vocab(), options_);
    seq->cached = seq->prefilled =
        placement.source ? slot.prefix.resume_from(*slot.sequence, placement.source->prefix, *placement.source->sequence,
                                                   seq->prompt(), placement.source->running != nullptr)
                         : slot.prefix.resume(*slot.sequence, seq->prompt());
    engine::check_prompt_fits(*slot.sequence, seq->prompt().subspan(size_t(seq->cached)));
    for (int32_t t : seq->prompt()) seq->sampler.accept(t);  // penalties see the whole prompt
    // The text, and the logprobs entries of the tokens it shows (the generation counts them).
    const auto sink = [stream, run = seq.get()](std::string_view text) {
      const auto& all = run->generation->result().logprobs;
      const size_t shown = run->generation->shown_logprobs();
      stream->push_text(text, std::span(all).subspan(run->logprobs_sent, shown - run->logprobs_sent));
      run->logprobs_sent = shown;
    };
    seq->generation = std::make_unique<engine::Generation>(model_.tokenizer, seq->sampler, seq->options, sink,
                                                           int64_t(seq->prompt().size()));
    slot.running = std::move(seq);
  } catch (const std::exception& e) {
    slot.prefix.clear();
    done_early();
    stream->fail(e.what());
  }
}

void EngineWorker::step() {
  for (auto& slot : slots_) {  // clients that went away end first
    if (slot->running && slot->running->queued.stream->cancelled()) {
      slot->running->generation->stop(engine::FinishReason::cancelled);
      finish(*slot);
    }
  }
  // Every decoding sequence's next token (or window), and one prompt chunk, slots taking turns.
  std::vector<engine::StepRow> batch;
  std::vector<Slot*> owners;
  // (With mtp_sequences, the sequences draft, and their drafters follow their prompts, only while
  // that many at most decode, or run: a drafter that did not follow starts over at its next window.)
  const auto few = [&](int64_t n) { return options_.mtp_sequences == 0 || n <= options_.mtp_sequences; };
  const bool drafting = options_.mtp > 0 && few(decoding_slots());
  const bool following = options_.mtp > 0 && few(running_slots());
  std::vector<Slot*> decoding;
  for (auto& slot : slots_)
    if (slot->running && !slot->running->prefilling()) decoding.push_back(slot.get());
  if (drafting) draft_windows(decoding);  // (all the drafters at once)
  for (Slot* slot : decoding) {
    if (!slot->running) continue;  // (its drafts failed)
    try {
      batch.push_back(decode_row(*slot, drafting));
    } catch (const std::exception& e) {
      fail_job(*slot, e.what());
      continue;
    }
    owners.push_back(slot);
  }
  // Prompt pieces, slots in turn from prefill_turn_: one, or as many as prompt_tokens allows (the
  // first always; the turn stops at the first piece that does not fit, so none is passed over).
  int64_t prompt_rows = 0, prompt_tokens = 0;
  const size_t turn = prefill_turn_;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = *slots_[(turn + i) % slots_.size()];
    if (!slot.running || !slot.running->prefilling()) continue;
    const Running& seq = *slot.running;
    const int64_t end = cuts_.next(seq.prompt(), seq.prefilled);
    if (prompt_rows > 0 && prompt_tokens + (end - seq.prefilled) > options_.prompt_tokens) break;
    const bool last = end == int64_t(seq.prompt().size());
    batch.push_back({.sequence = slot.sequence.get(),
                     .tokens = seq.prompt().subspan(size_t(seq.prefilled), size_t(end - seq.prefilled)),
                     .logit_rows = last ? 1 : 0,
                     .want_hidden = following});  // the drafter follows the prompt too
    owners.push_back(&slot);
    ++prompt_rows, prompt_tokens += end - seq.prefilled;
    prefill_turn_ = (turn + i + 1) % slots_.size();
    if (options_.prompt_tokens <= 0) break;
  }
  const bool prompt_chunk = prompt_rows > 0;
  const int64_t verified = std::ranges::count_if(std::span(batch).first(batch.size() - size_t(prompt_rows)),
                                                 [](const engine::StepRow& row) { return row.tokens.size() > 1; });
  const bool verifying = verified > 0;
  if (batch.empty()) return;
  {
    std::lock_guard lock(mutex_);
    ++step_counts_.steps;
    step_counts_.max_batch = std::max(step_counts_.max_batch, int64_t(batch.size()));
    if (prompt_chunk && int64_t(batch.size()) > prompt_rows) ++step_counts_.mixed_steps;  // (decoding rows too)
    step_counts_.max_prompt_rows = std::max(step_counts_.max_prompt_rows, prompt_rows);
  }
  const auto started = std::chrono::steady_clock::now();
  try {
    engine_->step(batch);
  } catch (const std::exception& e) {
    for (Slot* slot : owners) fail_job(*slot, e.what());
    return;
  }
  {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::lock_guard lock(mutex_);
    step_counts_.step_seconds += seconds;
    if (prompt_chunk) step_counts_.prompt_step_seconds += seconds, step_counts_.prompt_tokens += prompt_tokens;
    if (verifying) ++step_counts_.verify_steps, step_counts_.verify_step_seconds += seconds;
    step_counts_.max_verified_sequences = std::max(step_counts_.max_verified_sequences, verified);
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    try {
      advance(*owners[i], batch[i]);  // (sampling, a checkpoint, the drafter following)
    } catch (const std::exception& e) {
      if (owners[i]->running) fail_job(*owners[i], e.what());
    }
  }
  if (prompt_chunk && options_.checkpoint_bytes_limit > 0) bound_checkpoints();  // (checkpoints follow chunks)
  if (options_.token_delay.count() > 0) std::this_thread::sleep_for(options_.token_delay);
}

bool EngineWorker::let_room_go(Slot& slot) {
  try {
    slot.sequence->reserve(0);
    return true;
  } catch (const std::exception&) {  // (the engine's own failure: nothing more to give back)
    slot.prefix.clear();
    return false;
  }
}

std::shared_ptr<JobStream> EngineWorker::release(Slot& slot) {
  slot.prefix.clear();  // what the sequence holds is not known any more
  let_room_go(slot);
  std::shared_ptr<JobStream> stream = std::move(slot.running->queued.stream);
  slot.running.reset();
  std::lock_guard lock(mutex_);
  --active_;
  return stream;
}

void EngineWorker::fail_job(Slot& slot, const std::string& why) { release(slot)->fail(why); }

void EngineWorker::stop_job(Slot& slot) { release(slot)->fail_shutting_down(); }

int64_t EngineWorker::decoding_slots() const {
  return std::ranges::count_if(slots_, [](const auto& slot) { return slot->running && !slot->running->prefilling(); });
}

int64_t EngineWorker::running_slots() const {
  return std::ranges::count_if(slots_, [](const auto& slot) { return slot->running != nullptr; });
}

void EngineWorker::draft_windows(std::span<Slot* const> slots) {
  std::vector<engine::WindowAsk> asks;
  for (Slot* slot : slots) {
    const Running& seq = *slot->running;
    asks.push_back({slot->sequence.get(), seq.generation.get(), *seq.pending, &seq.options});
  }
  try {
    std::vector<std::vector<int32_t>> windows = engine::next_windows(asks);
    for (size_t i = 0; i < slots.size(); ++i) slots[i]->running->window = std::move(windows[i]);
    return;
  } catch (const std::exception&) {  // (one sequence's, maybe: each drafts alone, failing only its job)
  }
  for (Slot* slot : slots) {
    Running& seq = *slot->running;
    try {
      seq.window = engine::next_window(*slot->sequence, slot->sequence->drafter(), *seq.generation, *seq.pending,
                                       seq.options);
    } catch (const std::exception& e) {
      fail_job(*slot, e.what());
    }
  }
}

engine::StepRow EngineWorker::decode_row(Slot& slot, bool drafting) {
  Running& seq = *slot.running;
  engine::Sequence& sequence = *slot.sequence;
  if (!drafting) {
    seq.window.clear();  // plain greedy: only the token; sampling: only the top candidates (the GPU finds them)
    const bool top = !seq.generation->greedy_only() && seq.generation->top_only();
    seq.top_aside = top ? seq.generation->top_aside() : std::vector<int32_t>();
    return {.sequence = &sequence,
            .tokens = std::span(&*seq.pending, 1),
            .greedy_only = seq.generation->greedy_only(),
            .top_only = top,
            .top_aside = seq.top_aside};
  }
  seq.before = engine::window_checkpoint(sequence, seq.window);
  return engine::verify_row(sequence, seq.window, seq.generation->greedy_only());
}

void EngineWorker::advance(Slot& slot, const engine::StepRow& entry) {
  Running& seq = *slot.running;
  if (seq.prefilling()) {
    seq.prefilled += int64_t(entry.tokens.size());
    const bool last = !seq.prefilling();
    slot.prefix.after_chunk(*slot.sequence, entry.tokens, !last && cuts_.keeps_checkpoint(seq.prefilled));
    if (entry.want_hidden) engine::follow(*slot.sequence, slot.sequence->drafter(), entry.tokens, entry.hidden);
    if (!last) return;
    seq.pending = seq.generation->step(entry.logits);
  } else if (!seq.window.empty()) {
    seq.pending = engine::accept_window(*slot.sequence, slot.sequence->drafter(), *seq.generation, seq.window, entry,
                                        seq.before.get(), seq.counts);
  } else {
    seq.pending = entry.greedy_only ? seq.generation->step_chosen(entry.greedy.back())
                  : entry.top_only  ? seq.generation->step_top(entry.top)
                                    : seq.generation->step(entry.logits);
  }
  if (seq.pending && slot.sequence->position() >= context_) {
    seq.generation->stop(engine::FinishReason::context_full);
    seq.pending.reset();
  }
  if (!seq.pending) finish(slot);
}

void EngineWorker::finish(Slot& slot) {
  const std::unique_ptr<Running> seq = std::move(slot.running);
  engine::GenerateResult result = seq->generation->result();
  // What the sequence holds stays, for the next turn, until room is wanted (unless the engine
  // failed to let its room go: the reply is whole all the same).
  if (let_room_go(slot)) slot.prefix.record(result.tokens, result.last_token_pending);
  slot.last_used = ++clock_;
  result.prompt_tokens = int64_t(seq->prompt().size());
  result.cached_tokens = seq->cached;
  result.windows = seq->counts.windows;
  result.drafted = seq->counts.drafted;
  result.accepted = seq->counts.accepted;
  count_memory();
  {
    std::lock_guard lock(mutex_);
    --active_;
  }
  if (on_finished_) on_finished_(result);
  seq->queued.stream->finish(std::move(result));
}

void EngineWorker::run_fake(const Queued& queued) {
  // The fake text goes out in small pieces, as a model's would, so streaming is exercised too.
  const std::string& text = *options_.fake_output;
  engine::GenerateResult result;
  result.prompt_tokens = int64_t(queued.job.prompt.size());
  result.tokens = model_.tokenizer.encode(text, /*allow_special=*/true);
  result.finish = engine::FinishReason::end_of_generation;
  // Pieces of about five bytes, cut between characters as the detokenizer would.
  for (size_t i = 0, end = 0; i < text.size(); i = end) {
    if (queued.stream->cancelled()) {
      result.finish = engine::FinishReason::cancelled;
      break;
    }
    while (end < text.size() && end - i < 5) end += std::max<size_t>(1, utf8::valid_sequence_length(text, end));
    queued.stream->push_text(std::string_view(text).substr(i, end - i));
    if (options_.token_delay.count() > 0) std::this_thread::sleep_for(options_.token_delay);
  }
  if (on_finished_) on_finished_(result);
  queued.stream->finish(std::move(result));
}

}  // namespace lode::server
