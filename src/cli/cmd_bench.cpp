// `lode bench -m MODEL [-p 512] [-n 128] [--json]`: the CUDA backend's speed on a model, with the
// fraction of the device's measured copy bandwidth each figure reaches. First form (issue 7): the
// prompt still runs token by token on the GPU, so "prefill" is that; decode is the real thing.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "cli/commands.h"
#include "core/error.h"
#include "gguf/reader.h"
#include "model/qwen35moe.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/roofline.h"
#include "cuda/session.h"
#include "cuda/vram.h"
#endif

namespace lode::cli {
namespace {

struct BenchOptions {
  std::string model;
  int64_t prompt = 512;
  int64_t generate = 128;
  uint64_t seed = 1;
  bool json = false;
  bool profile = false;
};

#ifdef LODE_HAVE_CUDA

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A second session that waits for the GPU between phases: where one decode step's time goes.
void print_profile(const gguf::Reader& reader, const model::Qwen35MoeConfig& config, const BenchOptions& o) {
  cuda::CudaSession session(reader, config, {.max_context = o.generate + 8, .profile = true});
  std::vector<float> logits = session.decode(1);
  const auto before = session.profile();  // the first step is not counted
  for (int64_t i = 0; i < o.generate; ++i)
    logits = session.decode(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  double total = 0;
  const auto after = session.profile();
  for (size_t p = 0; p < after.size(); ++p) total += after[p].second - before[p].second;
  fmt::print("where a decode step goes (synchronising between phases: {:.2f} ms per token in all):\n",
             1e3 * total / double(o.generate));
  for (size_t p = 0; p < after.size(); ++p) {
    const double s = after[p].second - before[p].second;
    fmt::print("  {:<32} {:7.3f} ms  {:5.1f}%\n", after[p].first, 1e3 * s / double(o.generate), 100.0 * s / total);
  }
}

void run_bench(const BenchOptions& o) {
  gguf::Reader reader(o.model);
  const auto config = model::read_config(reader.metadata());
  const auto t_load = std::chrono::steady_clock::now();
  cuda::CudaSession session(reader, config, {.max_context = o.prompt + o.generate + 8});
  const double load_s = seconds_since(t_load);
  const size_t weights_held = session.vram().held(cuda::VramUse::weights) + session.vram().held(cuda::VramUse::experts);

  std::mt19937 rng(uint32_t(o.seed));
  std::vector<int32_t> prompt(static_cast<size_t>(o.prompt));
  for (int32_t& t : prompt) t = int32_t(rng() % uint32_t(config.vocab));
  session.prefill(std::span(prompt).first(std::min<size_t>(4, prompt.size())));  // warm-up
  session.reset();

  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = session.prefill(prompt);
  const double prefill_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.generate; ++i) {
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    logits = session.decode(next);
  }
  const double decode_s = seconds_since(t0);
  const double decode_tps = double(o.generate) / decode_s, prefill_tps = double(o.prompt) / prefill_s;
  const auto bytes = session.decode_bytes(o.prompt + o.generate / 2);  // the mean depth of the decode
  const double gbps = double(bytes.weights + bytes.state) * decode_tps / 1e9;
  const double peak_mib = double(session.vram().peak()) / double(1 << 20);  // before the probe's scratch
  const double ceiling = cuda::measure_copy_gbps(session.vram());
  if (o.json) {
    fmt::print("{{\"model\": \"{}\", \"prompt_tokens\": {}, \"prefill_tokens_per_s\": {:.1f}, \"generated_tokens\": {}, "
               "\"decode_tokens_per_s\": {:.1f}, \"decode_bytes_per_token\": {}, \"decode_GBps\": {:.1f}, "
               "\"copy_ceiling_GBps\": {:.1f}, \"decode_of_ceiling\": {:.4f}, \"peak_vram_MiB\": {:.1f}, "
               "\"weights_MiB\": {:.1f}, \"load_s\": {:.2f}}}\n",
               o.model, o.prompt, prefill_tps, o.generate, decode_tps, bytes.weights + bytes.state, gbps, ceiling,
               gbps / ceiling, peak_mib, double(weights_held) / double(1 << 20), load_s);
    return;
  }
  fmt::print("model: {} ({} layers, {} experts, top {}); weights on the GPU {:.1f} MiB, loaded in {:.1f} s\n", o.model,
             config.n_layers, config.n_experts, config.n_experts_used, double(weights_held) / double(1 << 20), load_s);
  fmt::print("prefill (token by token for now): {} tokens in {:.2f} s, {:.1f} tokens/s\n", o.prompt, prefill_s, prefill_tps);
  fmt::print("decode: {} tokens in {:.2f} s, {:.1f} tokens/s; {:.1f} MB read per token ({:.1f} MB weights, {:.2f} MB "
             "state), {:.1f} GB/s = {:.1f}% of the measured {:.0f} GB/s copy ceiling\n",
             o.generate, decode_s, decode_tps, double(bytes.weights + bytes.state) / 1e6, double(bytes.weights) / 1e6,
             double(bytes.state) / 1e6, gbps, 100.0 * gbps / ceiling, ceiling);
  fmt::print("peak VRAM held by lode: {:.1f} MiB\n", peak_mib);
  if (o.profile) print_profile(reader, config, o);
}

#else

void run_bench(const BenchOptions&) {
  fail("lode bench measures the CUDA backend, and this lode was built without CUDA (configure with "
       "LODE_CMAKE_ARGS=-DLODE_CUDA=ON on a machine with nvcc)");
}

#endif

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd = app.add_subcommand("bench", "Speed of the CUDA backend on a model, against the GPU's measured bandwidth");
  cmd->add_option("-m,--model", o->model, "GGUF model (for a split model: its first file)")->required();
  cmd->add_option("-p,--prompt", o->prompt, "Prompt tokens (random ids; default 512)")->check(CLI::PositiveNumber);
  cmd->add_option("-n,--generate", o->generate, "Tokens to decode greedily (default 128)")->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o->seed, "Seed of the random prompt (default 1)");
  cmd->add_flag("--json", o->json, "One JSON object instead of text");
  cmd->add_flag("--profile", o->profile,
                "Also decode once more, waiting for the GPU between phases, and show where a step's time goes");
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace lode::cli
