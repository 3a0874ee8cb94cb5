// The server's own cost per token: `lode serve`'s HTTP threads and engine worker in front of an
// engine whose steps cost nothing (each row's next token is the next token of a fixed English
// text, given as a greedy token, top candidates or logits, as the row asks). Drive it with the load
// generator; what it reaches is the ceiling the host side puts on a real engine's served tokens/s.
// Every 5 s it prints the worker's steps a second and rows a step. Results: docs/SERVER.md.
//
//   build/bench_server_host [PARALLEL=64] [PORT=8091] [MODEL=models/lode-mini.gguf] &
//   node tools/load/load.mjs --url http://127.0.0.1:8091 --concurrency 64 --requests 1024 --max-tokens 1024
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "server/server.h"

namespace {

using namespace lode;

struct FreeCheckpoint final : engine::Checkpoint {
  explicit FreeCheckpoint(int64_t p) : at(p) {}
  int64_t position() const override { return at; }
  int64_t bytes() const override { return 0; }
  int64_t at;
};

class FreeSequence final : public engine::Sequence {
 public:
  explicit FreeSequence(std::shared_ptr<engine::Model> model) : model_(std::move(model)) {}
  engine::Model& model() const override { return *model_; }
  int64_t position() const override { return position_; }
  int64_t max_context() const override { return model_->config().context_length; }
  int64_t kv_bytes() const override { return 0; }
  void reset() override { position_ = 0; }
  std::shared_ptr<const engine::Checkpoint> checkpoint() const override {
    return std::make_shared<FreeCheckpoint>(position_);
  }
  void rewind(const engine::Checkpoint& c) override { position_ = c.position(); }
  void copy_prefix(const engine::Sequence&, const engine::Checkpoint& c) override { position_ = c.position(); }
  int64_t position_ = 0;

 private:
  std::shared_ptr<engine::Model> model_;
};

class FreeModel final : public engine::Model {
 public:
  FreeModel(model::Qwen35MoeConfig config, std::vector<int32_t> text) : config_(config), text_(std::move(text)) {}
  const model::Qwen35MoeConfig& config() const override { return config_; }
  std::unique_ptr<engine::Sequence> open_sequence() override {
    return std::make_unique<FreeSequence>(shared_from_this());
  }
  void step(std::span<engine::StepRow> rows) override {
    ++steps, row_count += int64_t(rows.size());
    for (engine::StepRow& row : rows) {
      auto& sequence = static_cast<FreeSequence&>(*row.sequence);
      sequence.position_ += int64_t(row.tokens.size());
      const int32_t next = text_[size_t(sequence.position_) % text_.size()];
      if (row.greedy_only) {
        row.greedy.assign(size_t(row.logit_rows), next);
      } else if (row.top_only) {
        row.top = {.best = {{next, 30.0f}}, .finite = config_.vocab};
        for (const int32_t id : row.top_aside) row.top.aside.push_back({id, id == next ? 30.0f : 0.0f});
      } else {
        row.logits.assign(size_t(row.logit_rows * config_.vocab), 0.0f);
        for (int64_t r = 0; r < row.logit_rows; ++r) row.logits[size_t(r * config_.vocab + next)] = 30.0f;
      }
    }
  }
  engine::EngineInfo info() const override { return {.backend = "free", .kv_format = kv::Format::f16, .gpus = {}}; }
  std::atomic<int64_t> steps{0}, row_count{0};

 private:
  model::Qwen35MoeConfig config_;
  std::vector<int32_t> text_;
};

}  // namespace

int main(int argc, char** argv) {
  const int parallel = argc > 1 ? std::stoi(argv[1]) : 64, port = argc > 2 ? std::stoi(argv[2]) : 8091;
  // The model's tokenizer and config (only its vocabulary matters): the server streams real text.
  auto served = std::make_shared<const server::ServedModel>(argc > 3 ? argv[3] : "models/lode-mini.gguf");
  const std::string text =
      "The shell reads a line of text, splits it into words, expands the variables and runs the command that the "
      "first word names, waiting for it to end before it reads the next line. ";
  auto engine = std::make_shared<FreeModel>(served->config, served->tokenizer.encode(text, false));
  server::ServerOptions options{.port = port};
  options.worker.parallel = parallel;
  options.worker.max_queue = 4 * parallel;
  server::Server server(options, served, engine);
  server.start();
  std::fprintf(stderr, "a free engine behind lode serve on 127.0.0.1:%d, %d sequences\n", port, parallel);
  for (int64_t last_steps = 0, last_rows = 0;;) {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    const int64_t steps = engine->steps, rows = engine->row_count;
    if (steps > last_steps)
      std::fprintf(stderr, "%.0f steps/s, %.1f rows a step\n", double(steps - last_steps) / 5.0,
                   double(rows - last_rows) / double(steps - last_steps));
    last_steps = steps, last_rows = rows;
  }
}
