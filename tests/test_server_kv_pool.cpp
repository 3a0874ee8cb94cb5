// Admission by K/V room (WorkerOptions, engine::Sequence::reserve): on an engine whose sequences
// share a pool of positions, a request waits at the head of the queue until the running ones leave
// it room, idle slots' conversations are forgotten to make room, a request larger than the pool is
// refused up front (400), and the texts are what a server with room for all gives. The pool here is
// a test double around the CPU engine that keeps the GPU's promise rule (kv/page_tables.h): for each
// sequence the larger of its promise and the positions it holds, summed, within the pool; it can
// also fail as a device would, to show a failing engine fails one request, not the server.
#include <algorithm>
#include <atomic>
#include <thread>

#include "core/error.h"
#include "test_server_support.h"

namespace lode::test {
namespace {

class PooledModel;

class PooledSequence final : public engine::Sequence {
 public:
  PooledSequence(std::shared_ptr<PooledModel> model, std::unique_ptr<engine::Sequence> inner);
  ~PooledSequence() override;
  engine::Model& model() const override;
  int64_t position() const override { return inner_->position(); }
  int64_t max_context() const override { return inner_->max_context(); }
  int64_t kv_bytes() const override { return inner_->kv_bytes(); }
  void reset() override { inner_->reset(); }
  std::shared_ptr<const engine::Checkpoint> checkpoint() const override;
  void rewind(const engine::Checkpoint& checkpoint) override { inner_->rewind(checkpoint); }
  void copy_prefix(const engine::Sequence& other, const engine::Checkpoint& checkpoint) override {
    inner_->copy_prefix(*static_cast<const PooledSequence&>(other).inner_, checkpoint);
  }
  bool reserve(int64_t positions) override;

  engine::Sequence& inner() const { return *inner_; }
  int64_t reserved = 0;

 private:
  std::shared_ptr<PooledModel> model_;
  std::unique_ptr<engine::Sequence> inner_;
};

class PooledModel final : public engine::Model {
 public:
  PooledModel(std::shared_ptr<engine::Model> inner, int64_t pool) : inner_(std::move(inner)), pool_(pool) {}
  const model::Qwen35MoeConfig& config() const override { return inner_->config(); }
  std::unique_ptr<engine::Sequence> open_sequence() override {
    auto sequence = std::make_unique<PooledSequence>(std::static_pointer_cast<PooledModel>(shared_from_this()),
                                                     inner_->open_sequence());
    open_.push_back(sequence.get());
    return sequence;
  }
  void step(std::span<engine::StepRow> rows) override {
    std::vector<engine::StepRow> inner(rows.begin(), rows.end());
    for (engine::StepRow& row : inner) row.sequence = &static_cast<PooledSequence*>(row.sequence)->inner();
    inner_->step(inner);
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i].logits = std::move(inner[i].logits);
      rows[i].hidden = std::move(inner[i].hidden);
      rows[i].greedy = inner[i].greedy;
      rows[i].top = std::move(inner[i].top);
    }
    EXPECT_LE(committed_without(nullptr), pool_) << "the sequences hold more than the pool";
    int64_t held = 0;
    for (const PooledSequence* s : open_) held += s->position();
    free_ = pool_ - held;
  }
  engine::EngineInfo info() const override {
    engine::EngineInfo info = inner_->info();
    info.kv_pool_positions = pool_;
    return info;
  }
  int64_t kv_pool_free_positions() const override { return free_.load(); }
  std::atomic<int64_t> free_{0};  // (what the status shows: the double's count after each step)
  // Sum over the open sequences but `except` of the larger of promise and positions held.
  int64_t committed_without(const PooledSequence* except) const {
    int64_t total = 0;
    for (const PooledSequence* s : open_)
      if (s != except) total += std::max(s->reserved, s->position());
    return total;
  }
  int64_t pool() const { return pool_; }
  void closed(const PooledSequence* s) { open_.erase(std::find(open_.begin(), open_.end(), s)); }
  std::atomic<int64_t> refused{0};
  std::atomic<bool> failing_checkpoints{false};  // checkpoint() throws, as a device error would
  std::atomic<bool> failing_releases{false};     // reserve(0) throws likewise

 private:
  std::shared_ptr<engine::Model> inner_;
  int64_t pool_;
  std::vector<const PooledSequence*> open_;
};

PooledSequence::PooledSequence(std::shared_ptr<PooledModel> model, std::unique_ptr<engine::Sequence> inner)
    : model_(std::move(model)), inner_(std::move(inner)) {}
PooledSequence::~PooledSequence() { model_->closed(this); }
engine::Model& PooledSequence::model() const { return *model_; }

std::shared_ptr<const engine::Checkpoint> PooledSequence::checkpoint() const {
  if (model_->failing_checkpoints) fail("the device failed (a test's)");
  return inner_->checkpoint();
}

bool PooledSequence::reserve(int64_t positions) {
  if (positions == 0 && model_->failing_releases) fail("the device failed (a test's)");
  if (model_->committed_without(this) + std::max(positions, position()) > model_->pool()) {
    ++model_->refused;
    return false;
  }
  reserved = positions;
  return true;
}

json chat(const std::string& question, int max_tokens) {
  return {{"messages", {{{"role", "user"}, {"content", question}}}}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

// Two slots sharing 200 positions: while one request holds room for its prompt and 120 tokens, a
// second one that wants as much waits (not refused), then runs once the first ends, after its slot's
// conversation is forgotten to make room; both texts are those of a server with room for all.
TEST(ServerKvPool, ARequestWaitsForRoomThenRunsAsItWouldHave) {
  const auto pooled = std::make_shared<PooledModel>(mini_engine(), 200);
  server::ServerOptions o;
  o.worker.parallel = 2;
  o.worker.token_delay = std::chrono::milliseconds(5);
  TestServer server(o, pooled), roomy(o);
  EXPECT_EQ(server.get_json("/v1/status")["context"], 200);  // one request may fill the pool, no more
  EXPECT_EQ(server.get_json("/v1/status")["memory"]["kv_pool_positions"], 200);
  const json first_request = chat("Name three Unix commands for files.", 120);
  const json second_request = chat("What does grep do?", 120);
  json first, second;
  std::thread running([&] { first = server.post_json("/v1/chat/completions", first_request); });
  ASSERT_TRUE(eventually([&] { return server.get_json("/v1/status")["steps"]["total"] >= 2; }));
  std::thread waiting([&] { second = server.post_json("/v1/chat/completions", second_request); });
  // A slot is free, yet the second waits in the queue: the first holds the room.
  EXPECT_TRUE(eventually([&] {
    const json status = server.get_json("/v1/status");
    return status["queue"]["waiting"] == 1 && status["sequences"]["active"] == 1;
  }));
  running.join();
  waiting.join();
  EXPECT_GT(pooled->refused.load(), 0);
  EXPECT_EQ(server.get_json("/v1/status")["memory"]["kv_pool_free_positions"], pooled->free_.load());
  EXPECT_EQ(reply_text(first), reply_text(roomy.post_json("/v1/chat/completions", first_request)));
  EXPECT_EQ(reply_text(second), reply_text(roomy.post_json("/v1/chat/completions", second_request)));
  EXPECT_EQ(server.get_json("/v1/status")["sequences"]["active"], 0);
}

// A request that could not fit even alone is refused before it queues, saying why.
TEST(ServerKvPool, ARequestLargerThanThePoolIsRefused) {
  TestServer server({}, std::make_shared<PooledModel>(mini_engine(), 100));
  const json reply = server.post_json("/v1/chat/completions", chat("What does ls do?", 200), 400);
  EXPECT_NE(reply.dump().find("max_tokens"), std::string::npos) << reply.dump();
  server.post_json("/v1/chat/completions", chat("What does ls do?", 20));  // one that fits runs
}

// An engine that fails after a step (a checkpoint taken after a prompt chunk) fails that request
// alone: a 500 saying why, and the server goes on serving.
TEST(ServerKvPool, AnEngineFailureAfterAStepFailsThatRequestAlone) {
  const auto pooled = std::make_shared<PooledModel>(mini_engine(), 512);
  TestServer server({}, pooled);
  std::string long_text;
  for (int i = 0; i < 12; ++i) long_text += "line " + std::to_string(i) + " of a file\n";  // past a 64-token chunk
  pooled->failing_checkpoints = true;
  const json failed = server.post_json("/v1/chat/completions", chat(long_text, 4), 500);
  EXPECT_NE(failed.dump().find("the device failed"), std::string::npos) << failed.dump();
  pooled->failing_checkpoints = false;
  server.post_json("/v1/chat/completions", chat(long_text, 4));
  EXPECT_EQ(server.get_json("/v1/status")["sequences"]["active"], 0);
}

// An engine that fails to let a finished request's room go (reserve(0) throwing) still gives that
// request its whole reply, and its slot takes the next one: the reply is not lost with the
// failure, the request is not left running.
TEST(ServerKvPool, AnEngineThatFailsToLetRoomGoStillAnswers) {
  const auto pooled = std::make_shared<PooledModel>(mini_engine(), 512);
  server::ServerOptions o;
  o.worker.parallel = 1;
  TestServer server(o, pooled), plain(o);
  const json request = chat("What does grep do?", 8);
  const json want = plain.post_json("/v1/chat/completions", request);
  pooled->failing_releases = true;
  const json got = server.post_json("/v1/chat/completions", request);
  EXPECT_EQ(got["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"]);
  EXPECT_EQ(server.get_json("/v1/status")["sequences"]["active"], 0);
  pooled->failing_releases = false;
  const json again = server.post_json("/v1/chat/completions", request);
  EXPECT_EQ(again["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"]);
}

}  // namespace
}  // namespace lode::test
