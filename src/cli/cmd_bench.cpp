// `lode bench -m MODEL [-p 512,8192] [-n 128] [--depth 0,8192,32768] [--fill prompt|random] [--ctx N]
// [--window 2,3,4] [--sequences 4,16,64] [--prompts-together 4,16] [--repeats 3] [--vram-budget A,B,C]
// [--gpus 0,1] [--json]`: the CUDA backend's speed on a model, each figure
// beside its fraction of the device's limits measured in the same run (device-to-device copy
// bandwidth; bf16 and TF32 matrix throughput), and under each VRAM budget asked for, the expert
// tier's share of experts in VRAM, hit rate and bytes read over PCIe. With --gpus, the layers spread
// over those GPUs (cuda/pipeline.h), each with the budget; the ceilings are GPU 0's.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <random>

#include "cli/backend.h"
#include "cli/commands.h"
#include "cli/expert_profile.h"
#include "cli/validators.h"
#include "core/error.h"
#include "gguf/reader.h"
#include "measure/bench_report.h"
#include "measure/kernel_table.h"
#include "model/qwen35moe.h"
#include "model/weights.h"
#include "plan/memory_plan.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/on_device.h"
#include "cuda/pipeline.h"
#include "cuda/roofline.h"
#include "cuda/session.h"
#include "cuda/vram.h"
#endif

namespace lode::cli {
namespace {

struct BenchOptions {
  std::string model;
  std::vector<int64_t> prompts = {512};
  std::vector<int64_t> depths = {0};
  std::vector<int64_t> windows;  // verify windows timed at each depth (tokens in one step)
  std::vector<int64_t> sequences;  // steps of that many sequences timed at each depth (a token each)
  std::vector<int64_t> sequence_windows;  // and of those sequences' verify windows of that many tokens each
  std::vector<int64_t> pieces;     // that many prompts of the first length read together
  int64_t generate = 128;
  int repeats = 3;
  int64_t prompt_chunk = 4096;
  std::string kv;  // empty: LODE_KV, else fp16
  std::string fill = "prompt";  // how a depth is reached: a prompt, or random cells (deep contexts)
  int64_t ctx = 0;              // positions of K/V allocated; 0: what the runs need
  std::vector<int64_t> vram_budgets_mib = {0};  // 0: the default budget
  std::string expert_profile;
  std::string expert_swaps = "on";
  std::string miss_path = "auto";
  uint64_t seed = 1;
  std::string gpus;  // --gpus: the layers spread over these GPUs (empty: GPU 0 alone)
  std::string hand_over = "peer";  // --hand-over: how rows cross between them (peer copies or NCCL)
  bool json = false;
  bool profile = false;
};

#ifdef LODE_HAVE_CUDA

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int32_t argmax(const std::vector<float>& v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

using measure::Ceilings;
using measure::DecodeFigures;
using measure::PrefillFigures;
using measure::TierFigures;

// What the expert tier did between two snapshots.
TierFigures tier_delta(const cuda::ExpertStats& before, const cuda::ExpertStats& after) {
  const uint64_t routed = after.routed - before.routed, missed = after.missed - before.missed;
  return {routed ? 1.0 - double(missed) / double(routed) : 1.0,
          double(after.decode_miss_bytes - before.decode_miss_bytes + after.prompt_miss_bytes -
                 before.prompt_miss_bytes),
          double(after.cpu_experts - before.cpu_experts),
          double(after.cpu_expert_bytes - before.cpu_expert_bytes),
          after.cpu_seconds - before.cpu_seconds,
          double(after.cpu_hinted_experts - before.cpu_hinted_experts),
          double(after.cpu_read_ahead_bytes - before.cpu_read_ahead_bytes),
          after.gpu_share_seconds - before.gpu_share_seconds,
          after.host_wait_seconds - before.host_wait_seconds,
          after.swaps - before.swaps};
}

// Per token (or per run) instead of in all.
TierFigures per(TierFigures t, double n) {
  t.pcie_bytes /= n, t.cpu_experts /= n, t.cpu_bytes /= n, t.cpu_seconds /= n, t.cpu_hinted /= n, t.cpu_read_ahead /= n;
  t.gpu_share_seconds /= n, t.host_wait_seconds /= n;
  return t;
}

// Every call here ends with the device idle (the logits are on the host), so wall-clock time
// around a call is the GPU's time for it.
PrefillFigures bench_prefill(cuda::CudaPipeline& session, const std::vector<int32_t>& tokens, int64_t n, int repeats) {
  const std::span<const int32_t> prompt(tokens.data(), size_t(n));
  std::vector<double> seconds;
  cuda::ExpertStats before;
  for (int r = 0; r <= repeats; ++r) {  // the first is the warm-up
    session.reset();
    if (r == 1) before = session.expert_stats();
    const auto t0 = Clock::now();
    session.prefill(prompt);
    if (r > 0) seconds.push_back(seconds_since(t0));
  }
  const double s = median(seconds);
  const TierFigures tier = per(tier_delta(before, session.expert_stats()), double(repeats));
  return {n, double(n) / s, session.prompt_flops(0, n) / s / 1e12, tier};
}

// Decode at a context depth: the depth filled by a prompt (or, with random_fill, by random cells:
// the same work per step, without a prompt's quadratic attention to get there), then `repeats` runs
// of `generate` greedy tokens after two warm-up steps; the median run. The tokens are chosen on the
// device (CudaSession::decode_greedy), as `lode run` would at temperature 0.
DecodeFigures bench_decode(cuda::CudaPipeline& session, const std::vector<int32_t>& tokens, int64_t depth, int64_t generate,
                           int repeats, bool random_fill) {
  session.reset();
  if (random_fill) session.fill_with_random_cells(depth);
  int32_t token = depth > 0 && !random_fill ? argmax(session.prefill(std::span(tokens.data(), size_t(depth))))
                                            : session.decode_greedy(1);
  for (int i = 0; i < 2; ++i) token = session.decode_greedy(token);
  std::vector<double> rates;
  const cuda::ExpertStats before = session.expert_stats();
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < generate; ++i) token = session.decode_greedy(token);
    rates.push_back(double(generate) / seconds_since(t0));
  }
  const TierFigures tier = per(tier_delta(before, session.expert_stats()), double(generate * repeats));
  const auto bytes = session.decode_bytes(depth + 2 + generate * repeats / 2);  // the mean depth
  const double per_token = double(bytes.weights + bytes.state), rate = median(rates);
  return {depth, rate, per_token, per_token * rate / 1e9, tier};
}

// Seconds a call of `run` takes: the median over `repeats` runs of `calls` calls each.
template <class Run>
double median_seconds_per_call(const Run& run, int64_t calls, int repeats) {
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < calls; ++i) run();
    seconds.push_back(seconds_since(t0) / double(calls));
  }
  return median(seconds);
}

// Verify windows of `n` tokens where bench_decode left the session: `generate` tokens' worth of
// windows per run after a warm-up window (which captures the window's graph), each row's greedy
// token chosen on the device (the drafts are the window's last greedy token again: what they are
// does not change the work); the median run, against the one-token step of `step`.
measure::WindowFigures bench_window(cuda::CudaPipeline& session, const DecodeFigures& step, int64_t n, int64_t generate,
                                    int repeats) {
  const int64_t windows = std::max<int64_t>(generate / n, 1);
  int32_t token = 1;
  const auto run = [&] {
    const std::vector<int32_t> tokens(size_t(n), token);
    token = session.decode_window(tokens, true).greedy.back();
  };
  run();
  const cuda::ExpertStats before = session.expert_stats();
  const double s = median_seconds_per_call(run, windows, repeats);
  return {.depth = step.depth, .tokens = n, .seconds = s, .step_ratio = s * step.tokens_per_s,
          .tier = per(tier_delta(before, session.expert_stats()), double(windows * repeats))};
}

// Steps of `n` sequences, each at the depth sequence 0 was filled to (`start`, restored into each,
// or random cells), `generate` steps a run after a warm-up step, each row's greedy token chosen on
// the device; the median run, against the one-token step of `step`. Sequence 0 is left as it was.
// Rows of sequences 0..n-1, each started from `start` (or random cells to `depth`).
// (Session: the bench's pipeline, or the profile's session.)
template <class Session>
std::vector<cuda::CudaSession::Row> started_rows(Session& session, int64_t n, int64_t depth,
                                                 const typename Session::Snapshot* start) {
  std::vector<cuda::CudaSession::Row> rows(static_cast<size_t>(n));
  for (int64_t s = 0; s < n; ++s) {
    session.use_sequence(s);
    start ? session.restore(*start) : session.fill_with_random_cells(depth);
    rows[size_t(s)] = {s, int32_t(1 + s)};
  }
  return rows;
}

// One step of every row, each sequence's next tokens the greedy token of its last row (a verify
// window's rows, consecutive, all take it: every draft accepted).
template <class Session>
void step_rows_greedily(Session& session, std::vector<cuda::CudaSession::Row>& rows) {
  const std::vector<int32_t> next = session.decode_rows(rows, true).greedy;
  for (size_t r = rows.size(); r-- > 0;)
    rows[r].token = r + 1 < rows.size() && rows[r + 1].sequence == rows[r].sequence ? rows[r + 1].token : next[r];
}

// Whether --sequence-windows times steps of n sequences with windows of w tokens (at most a step's rows).
bool times_sequence_window(int64_t n, int64_t w) { return w > 1 && n * w <= cuda::kMaxStepRows; }

// Of the steps --sequences with --sequence-windows times: the most rows one takes (0: none) and the
// widest window (1: none).
struct SequenceWindows {
  int64_t rows = 0, widest = 1;
};
SequenceWindows timed_sequence_windows(const BenchOptions& o) {
  SequenceWindows most;
  for (int64_t n : o.sequences)
    for (int64_t w : o.sequence_windows)
      if (times_sequence_window(n, w)) most.rows = std::max(most.rows, n * w), most.widest = std::max(most.widest, w);
  return most;
}

measure::SequencesFigures bench_sequences(cuda::CudaPipeline& session, const DecodeFigures& step, int64_t n, int64_t generate,
                                          int repeats, const cuda::CudaPipeline::Snapshot* start, int64_t window = 1) {
  const cuda::CudaPipeline::Snapshot zero = session.save();
  std::vector<cuda::CudaSession::Row> rows;
  for (const cuda::CudaSession::Row& row : started_rows(session, n, step.depth, start))
    rows.insert(rows.end(), size_t(window), row);  // (a window: the sequence's rows consecutive)
  const auto run = [&] { step_rows_greedily(session, rows); };
  run();
  const cuda::ExpertStats before = session.expert_stats();
  const double s = median_seconds_per_call(run, generate, repeats);
  session.use_sequence(0);
  session.restore(zero);
  return {.depth = step.depth, .sequences = n, .window = window, .seconds = s, .step_ratio = s * step.tokens_per_s,
          .tier = per(tier_delta(before, session.expert_stats()), double(generate * repeats))};
}

// The drafts of a step of n sequences' verify windows of w tokens: w - 1 steps of the MTP block
// over a row of each sequence (CudaSession::mtp_draft_rows, as the GPU server drafts), the first
// from random hidden states, at K/V rows `row`.. of the sequences' caches of the block (what the
// rows hold does not change the work); the median of `repeats` runs of `generate` windows' drafts
// after a warm-up, per window.
double bench_drafts(cuda::CudaPipeline& pipeline, int64_t n, int64_t w, int64_t row, int64_t generate, int repeats) {
  cuda::CudaSession& session = pipeline.drafting();  // (the last GPU's, where the layers are spread)
  const cuda::OnDevice on(session.device());
  const int64_t width = session.config().hidden;
  const size_t count = static_cast<size_t>(n);
  std::vector<int64_t> sequences(count), shifts(count, 1), rows(count);
  std::iota(sequences.begin(), sequences.end(), int64_t(0));
  std::vector<int32_t> tokens(count, 1), out(count);
  std::vector<float> hidden(size_t(n * width));
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : hidden) x = normal(random);
  row = std::clamp<int64_t>(row, 0, session.max_context() - w);
  const auto run = [&] {
    for (int64_t d = 0; d + 1 < w; ++d) {
      std::fill(rows.begin(), rows.end(), row + d);
      session.mtp_draft_rows(sequences, tokens, d == 0 ? std::span<const float>(hidden) : std::span<const float>(),
                             rows, shifts, out, {});
    }
  };
  run();
  return median_seconds_per_call(run, generate, repeats);
}

// `count` prompts of `n` tokens, sequence s reading the tokens from s on, from empty sequences, in
// passes that take as many as fit one (CudaSession::prefill_pieces); the median of `repeats` runs
// after a warm-up, against one prompt at a time (`alone`: the prefill of n tokens). Sequence 0 is
// left empty.
measure::PiecesFigures bench_pieces(cuda::CudaPipeline& session, const std::vector<int32_t>& tokens, int64_t n,
                                    int64_t count, int repeats, const PrefillFigures& alone) {
  if (!session.pieces_fit(std::span(&n, 1)))
    fail("--prompts-together: prompts of {} tokens do not fit one pass of the prompt path ({} rows)", n,
         session.prompt_chunk());
  std::vector<cuda::CudaSession::Piece> pieces;
  for (int64_t s = 0; s < count; ++s)
    pieces.push_back({.sequence = s, .tokens = std::span(tokens.data() + s, size_t(n)), .logits = true});
  std::vector<std::vector<cuda::CudaSession::Piece>> passes;
  std::vector<int64_t> lengths;
  for (const cuda::CudaSession::Piece& p : pieces) {
    lengths.push_back(n);
    if (passes.empty() || !session.pieces_fit(lengths)) passes.emplace_back(), lengths = {n};
    passes.back().push_back(p);
  }
  const auto reset_all = [&] {
    for (int64_t s = 0; s < count; ++s) session.use_sequence(s), session.reset();
  };
  const auto run = [&] {
    for (const auto& pass : passes) session.prefill_pieces(pass);
  };
  reset_all(), run();
  const cuda::ExpertStats before = session.expert_stats();
  std::vector<double> times;  // (the resets untimed, as bench_prefill's)
  for (int r = 0; r < repeats; ++r) {
    reset_all();
    const auto t0 = Clock::now();
    run();
    times.push_back(seconds_since(t0));
  }
  const double seconds = median(times);
  const TierFigures tier = per(tier_delta(before, session.expert_stats()), double(repeats * count));
  for (int64_t s = count - 1; s >= 0; --s) session.use_sequence(s), session.reset();
  return {.tokens = n, .prompts = count, .passes = int64_t(passes.size()), .seconds = seconds,
          .alone_tokens_per_s = alone.tokens_per_s, .tier = tier};
}

cuda::CudaSessionOptions session_options(const BenchOptions& o, int64_t max_context, int64_t budget_mib,
                                         const std::vector<double>& expert_scores, bool with_mtp = false) {
  cuda::CudaSessionOptions options;
  options.max_context = max_context;
  options.vram_budget = size_t(budget_mib) << 20;
  options.expert_scores = expert_scores;
  options.swaps.enabled = o.expert_swaps == "on";
  options.miss_path = miss_path_from(o.miss_path);
  options.prompt_chunk = o.prompt_chunk;
  options.kv_format = chosen_kv_format(o.kv);
  options.mtp = with_mtp;  // (for --sequence-windows' drafts)
  options.step_rows = o.windows.empty() ? 1 : *std::max_element(o.windows.begin(), o.windows.end());
  options.window_rows = options.step_rows;
  if (!o.sequences.empty()) {
    options.sequences = *std::max_element(o.sequences.begin(), o.sequences.end());
    options.step_rows = std::max(options.step_rows, options.sequences);
    const int64_t rows = timed_sequence_windows(o).rows;  // (their states kept for every row)
    options.step_rows = std::max(options.step_rows, rows), options.window_rows = std::max(options.window_rows, rows);
  }
  if (!o.pieces.empty()) {
    const int64_t most = *std::max_element(o.pieces.begin(), o.pieces.end());
    options.sequences = std::max(options.sequences, most);
    options.step_rows = std::max(options.step_rows, most);
  }
  return options;
}

// The profile sessions' context: the bench's when one is given (decode attention's splits follow
// it), else room for the longest prompt, twice the decoded tokens, the windows' and the sequences' as many again.
int64_t profile_context(const BenchOptions& o) {
  int64_t windows = 0;
  for (int64_t n : o.windows) windows += std::max<int64_t>(o.generate / n, 1) * n;
  const int64_t sequences = o.sequences.empty() ? 0 : o.generate + 1;  // (each from where the windows left off)
  return std::max(o.ctx, o.prompts.back() + 2 * o.generate + windows + sequences + 8);
}

// The kernel classes' time and launches since `before` (kernel_profile's totals then).
std::vector<cuda::KernelClassTime> since(std::vector<cuda::KernelClassTime> now,
                                         const std::vector<cuda::KernelClassTime>& before) {
  for (cuda::KernelClassTime& c : now)
    for (const cuda::KernelClassTime& b : before)
      if (b.name == c.name) c.launches -= b.launches, c.seconds -= b.seconds, c.bytes -= b.bytes;
  std::erase_if(now, [](const cuda::KernelClassTime& c) { return c.launches == 0; });
  return now;
}

// What print_profile timed: the kernel classes of a decode step, and whether every expert was in
// VRAM.
struct ProfileRun {
  std::vector<cuda::KernelClassTime> classes;
  bool all_resident = true;
};

// The prompt path's phases between two of CudaSession::prompt_profile's totals, as a table under
// `title` (which takes the milliseconds in all).
void print_prompt_phases(const std::vector<std::pair<std::string, double>>& before,
                         const std::vector<std::pair<std::string, double>>& after, const std::string& title) {
  double total = 0;
  for (size_t p = 0; p < after.size(); ++p) total += after[p].second - (p < before.size() ? before[p].second : 0.0);
  fmt::print(fmt::runtime(title), 1e3 * total);
  for (size_t p = 0; p < after.size(); ++p) {
    const double s = after[p].second - (p < before.size() ? before[p].second : 0.0);
    fmt::print("  {:<34} {:8.1f} ms  {:5.1f}%\n", after[p].first, 1e3 * s, 100.0 * s / std::max(total, 1e-12));
  }
}

// Where one pass of `count` prompts of `n` tokens goes (--prompts-together), phase by phase, after
// a pass to warm up: sequence s, emptied first, reads the tokens from s on, as bench_pieces has
// them.
void print_pieces_profile(cuda::CudaSession& session, const std::vector<int32_t>& tokens, int64_t n, int64_t count) {
  const std::vector<int64_t> lengths(size_t(count), n);
  if (!session.pieces_fit(lengths)) {
    fmt::print("{} prompts of {} tokens do not fit one pass of {} rows: not profiled\n", count, n,
               session.prompt_chunk());
    return;
  }
  std::vector<cuda::CudaSession::Piece> pieces;
  for (int64_t s = 0; s < count; ++s)
    pieces.push_back({.sequence = s, .tokens = std::span(tokens.data() + s, size_t(n)), .logits = true});
  const auto reset_all = [&] {
    for (int64_t s = 0; s < count; ++s) session.use_sequence(s), session.reset();
  };
  reset_all(), session.prefill_pieces(pieces), reset_all();
  const auto before = session.prompt_profile();
  session.prefill_pieces(pieces);
  print_prompt_phases(before, session.prompt_profile(),
                      fmt::format("where {} prompts of {} tokens in one pass go (synchronising between phases: "
                                  "{{:.1f}} ms in all):\n",
                                  count, n));
  session.use_sequence(0);
}

// A second session that waits for the GPU between phases: where the time of one decode step and of
// one prompt goes; then the same number of steps timed kernel by kernel (those kernel classes), and
// with --prompts-together where a pass of that many prompts goes.
ProfileRun print_profile(const gguf::Reader& reader, const model::Qwen35MoeConfig& config, const BenchOptions& o,
                        const std::vector<int32_t>& tokens, int64_t budget_mib,
                        const std::vector<double>& expert_scores, double copy_gbps) {
  const int64_t prompt = o.prompts.back();
  cuda::CudaSessionOptions options = session_options(o, profile_context(o), budget_mib, expert_scores);
  options.profile = true;
  cuda::CudaSession session(reader, config, options);
  int32_t token = argmax(session.prefill(std::span(tokens.data(), size_t(prompt))));
  const auto decode_greedily = [&] {
    for (int64_t i = 0; i < o.generate; ++i) token = session.decode_greedy(token);
  };
  const auto before = session.profile();
  decode_greedily();
  const auto after = session.profile();
  double total = 0;
  for (size_t p = 0; p < after.size(); ++p) total += after[p].second - before[p].second;
  fmt::print("where a decode step goes at depth {} (synchronising between phases: {:.2f} ms per token in all):\n",
             prompt, 1e3 * total / double(o.generate));
  for (size_t p = 0; p < after.size(); ++p) {
    const double s = after[p].second - before[p].second;
    fmt::print("  {:<34} {:8.3f} ms  {:5.1f}%\n", after[p].first, 1e3 * s / double(o.generate), 100.0 * s / total);
  }
  print_prompt_phases({}, session.prompt_profile(),
                      fmt::format("where a {}-token prompt goes (chunks of {}; synchronising between phases: "
                                  "{{:.1f}} ms in all):\n",
                                  prompt, session.prompt_chunk()));
  session.profile_steps_by(cuda::StepProfile::kernels);
  const int64_t depth = session.position();
  decode_greedily();
  const std::vector<cuda::KernelClassTime> classes = session.kernel_profile();
  fmt::print("{}", measure::kernel_table_text(classes, o.generate, depth, copy_gbps));
  for (int64_t n : o.windows) {  // verify windows, kernel by kernel
    const std::vector<cuda::KernelClassTime> before = session.kernel_profile();
    const int64_t windows = std::max<int64_t>(o.generate / n, 1), at = session.position();
    for (int64_t w = 0; w < windows; ++w)
      token = session.decode_window(std::vector<int32_t>(size_t(n), token), true).greedy.back();
    fmt::print("verify windows of {} tokens, {} of them (below, a step is one window of {} tokens):\n", n, windows, n);
    fmt::print("{}", measure::kernel_table_text(since(session.kernel_profile(), before), windows, at, copy_gbps));
  }
  if (!o.sequences.empty()) {  // steps of several sequences, each from where sequence 0 is now
    const cuda::CudaSession::Snapshot zero = session.save();
    const int64_t at = session.position();
    for (int64_t n : o.sequences) {
      std::vector<cuda::CudaSession::Row> rows = started_rows(session, n, at, &zero);
      step_rows_greedily(session, rows);  // (captures the step's graph)
      const std::vector<cuda::KernelClassTime> before = session.kernel_profile();
      for (int64_t i = 0; i < o.generate; ++i) step_rows_greedily(session, rows);
      fmt::print("steps of {} sequences, {} of them (below, a step is one token of each):\n", n, o.generate);
      fmt::print("{}", measure::kernel_table_text(since(session.kernel_profile(), before), o.generate, at, copy_gbps));
    }
    session.use_sequence(0);
    session.restore(zero);
  }
  for (int64_t count : o.pieces) print_pieces_profile(session, tokens, o.prompts.front(), count);
  return {classes, session.plan().all_resident()};
}

// What each kernel class of print_profile's table costs inside the real step, whose launches
// overlap (the events of that table keep them apart): a session without profiling, at the same
// depth, times `generate` steps whole and then without each class's launches, from the same
// snapshot each time (a left-out class leaves the outputs and states meaningless); the whole step
// again at the end shows the drift.
void print_costs_in_step(const gguf::Reader& reader, const model::Qwen35MoeConfig& config, const BenchOptions& o,
                         const std::vector<int32_t>& tokens, int64_t budget_mib, const std::vector<double>& expert_scores,
                         const std::vector<cuda::KernelClassTime>& classes) {
  const int64_t prompt = o.prompts.back();
  cuda::CudaSession session(reader, config, session_options(o, profile_context(o), budget_mib, expert_scores));
  const std::vector<float> first = session.prefill(std::span(tokens.data(), size_t(prompt)));
  const cuda::CudaSession::Snapshot start = session.save();
  const auto seconds_a_step = [&] {  // after one untimed step, which captures the step's graph
    session.restore(start);
    int32_t token = session.decode_greedy(argmax(first));
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < o.generate; ++i) token = session.decode_greedy(token);
    return seconds_since(t0) / double(o.generate);
  };
  const double whole_before = seconds_a_step();
  // One row per launch name (classes of one launch with several weight types are one row).
  std::vector<measure::StepWithout> rows;
  for (const cuda::KernelClassTime& c : classes) {
    if (!cuda::CudaSession::can_leave_out(c.launch)) continue;
    auto row = std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r.name == c.launch; });
    if (row == rows.end()) row = rows.insert(rows.end(), measure::StepWithout{.name = c.launch});
    row->launches += double(c.launches) / double(std::max<int64_t>(o.generate, 1));
  }
  for (measure::StepWithout& row : rows) {
    session.leave_out({row.name});
    row.step_seconds = seconds_a_step();
  }
  session.leave_out({});
  const double whole_after = seconds_a_step();
  fmt::print("{}", measure::step_cost_table_text((whole_before + whole_after) / 2, rows, prompt));
  fmt::print("  (the whole step {:.3f} ms before the rows, {:.3f} ms after)\n", 1e3 * whole_before, 1e3 * whole_after);
}

Ceilings measure_ceilings() {
  cuda::VramAccountant probe;
  return {cuda::measure_copy_gbps(probe), cuda::measure_matmul_tflops(probe, cuda::MatmulKind::bf16),
          cuda::measure_matmul_tflops(probe, cuda::MatmulKind::tf32), cuda::measure_host_to_device_gbps(probe),
          cuda::measure_mapped_read_gbps(probe)};
}

// The prompts, then at each depth the decode, the windows and the steps of several sequences, on
// the model's GPUs: one (a pipeline of one share is its session, called straight through, as the
// engine runs it) or several (--gpus).
measure::BenchRun bench_at(const gguf::Reader& reader, const model::Qwen35MoeConfig& config, const BenchOptions& o,
                  const std::vector<int32_t>& tokens, int64_t context, int64_t budget_mib,
                  const std::vector<double>& expert_scores) {
  const std::vector<int> gpus = o.gpus.empty() ? std::vector<int>{0} : parse_gpus(o.gpus);
  const auto t_load = Clock::now();
  auto weights = std::make_shared<const model::ModelWeights>(model::bind_weights(reader, config));
  // --sequence-windows times their drafts too where the file has the MTP block.
  const bool drafts = !o.sequence_windows.empty() && weights->mtp;
  cuda::CudaPipeline pipeline(reader, weights, session_options(o, context, budget_mib, expert_scores, drafts), gpus,
                              o.hand_over == "nccl" ? cuda::HandOverBy::nccl : cuda::HandOverBy::peer_copy);
  measure::BenchRun b;
  b.model = o.model, b.kv = kv::to_string(chosen_kv_format(o.kv)), b.fill = o.fill;
  b.generated = o.generate, b.repeats = o.repeats;
  b.load_s = seconds_since(t_load);
  b.plan = pipeline.plan();
  if (pipeline.shares() > 1)
    b.layout = pipeline.describe() +
               fmt::format("\nrows handed between GPUs by {}", o.hand_over == "nccl" ? "NCCL" : "peer copies");
  for (size_t g = 0; g < pipeline.shares(); ++g) {
    const cuda::VramAccountant& vram = pipeline.share(g).vram();
    b.weights_mib += double(vram.held(cuda::VramUse::weights) + vram.held(cuda::VramUse::experts)) / double(1 << 20);
  }
  for (int64_t n : o.prompts) b.prefills.push_back(bench_prefill(pipeline, tokens, n, o.repeats));
  for (int64_t count : o.pieces)
    b.pieces.push_back(bench_pieces(pipeline, tokens, o.prompts.front(), count, o.repeats, b.prefills.front()));
  for (int64_t depth : o.depths) {
    b.decodes.push_back(bench_decode(pipeline, tokens, depth, o.generate, o.repeats, o.fill == "random"));
    for (int64_t n : o.windows) b.windows.push_back(bench_window(pipeline, b.decodes.back(), n, o.generate, o.repeats));
    if (o.sequences.empty()) continue;
    // The other sequences start where a prompt left sequence 0 (or from random cells, as it did).
    const std::optional<cuda::CudaPipeline::Snapshot> start =
        o.fill == "random" ? std::nullopt : std::optional(pipeline.save());
    for (int64_t n : o.sequences) {
      const measure::SequencesFigures plain =
          b.sequences.emplace_back(bench_sequences(pipeline, b.decodes.back(), n, o.generate, o.repeats, start ? &*start : nullptr));
      for (int64_t w : o.sequence_windows) {
        if (!times_sequence_window(n, w)) continue;
        measure::SequencesFigures f =
            bench_sequences(pipeline, b.decodes.back(), n, o.generate, o.repeats, start ? &*start : nullptr, w);
        f.plain_ratio = f.seconds / plain.seconds;
        if (drafts) f.draft_seconds = bench_drafts(pipeline, n, w, b.decodes.back().depth, o.generate, o.repeats);
        b.sequences.push_back(f);
      }
    }
  }
  for (size_t g = 0; g < pipeline.shares(); ++g) b.peak_mib += double(pipeline.share(g).vram().peak()) / double(1 << 20);
  b.prompt_chunk = pipeline.prompt_chunk();
  b.context = pipeline.max_context();
  const cuda::ExpertStats tier = pipeline.expert_stats();
  b.host_tier = tier.host_tier, b.miss_path = tier.miss_path;
  return b;
}

void run_bench(const BenchOptions& o) {
  if (!o.sequence_windows.empty() && o.sequences.empty())
    fail("--sequence-windows {}: times the windows of the steps of --sequences; give --sequences too",
         fmt::join(o.sequence_windows, ","));
  if (!o.gpus.empty() && parse_gpus(o.gpus).size() > 1 && o.profile)
    fail("--gpus {}: --profile runs on one GPU only for now", o.gpus);
  gguf::Reader reader(o.model);
  const auto config = model::read_config(reader.metadata());
  const Ceilings ceilings = measure_ceilings();
  // Each window size decodes about as many tokens again, and a warm-up window.
  int64_t after_depth = 2 + o.generate * o.repeats;
  for (int64_t n : o.windows) after_depth += n * (std::max<int64_t>(o.generate / n, 1) * o.repeats + 1);
  if (!o.sequences.empty())  // (from where sequence 0 got to; a window's tokens a step)
    after_depth += (o.generate * o.repeats + 1) * timed_sequence_windows(o).widest;
  // (Prompts read together: sequence s reads the tokens from s on.)
  const int64_t together = o.pieces.empty() ? 0 : o.prompts.front() + *std::max_element(o.pieces.begin(), o.pieces.end());
  const int64_t longest = std::max({*std::max_element(o.prompts.begin(), o.prompts.end()),
                                    *std::max_element(o.depths.begin(), o.depths.end()) + after_depth, together});
  if (o.ctx > 0 && o.ctx < longest + 8)
    fail("--ctx {}: the runs asked for need {} positions (the deepest depth, 2 warm-up steps, {} x {} decoded "
         "tokens and the windows', or the longest prompt, plus 8)", o.ctx, longest + 8, o.repeats, o.generate);
  const std::vector<double> scores = o.expert_profile.empty()
                                         ? std::vector<double>{}
                                         : expert_scores_from(o.expert_profile, model::bind_weights(reader, config));
  std::mt19937 rng(uint32_t(o.seed));
  std::vector<int32_t> tokens(static_cast<size_t>(longest));
  for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(config.vocab));
  if (!o.json) {
    fmt::print("model: {} ({} layers, {} experts, top {})\n", o.model, config.n_layers, config.n_experts,
               config.n_experts_used);
    fmt::print("{}", measure::ceilings_text(ceilings));
  }
  for (const int64_t budget : o.vram_budgets_mib) {
    const measure::BenchRun b = bench_at(reader, config, o, tokens, o.ctx > 0 ? o.ctx : longest + 8, budget, scores);
    fmt::print("{}", o.json ? measure::to_json(ceilings, b).dump() + "\n" : measure::to_text(ceilings, b));
    if (!o.profile) continue;
    const ProfileRun run = print_profile(reader, config, o, tokens, budget, scores, ceilings.copy_gbps);
    // (With experts in host RAM, a step without a class's launches would route on meaningless
    // values, and the expert tier would fetch, place and compute experts by them: no cost of the
    // real step. Under a 16 GiB budget such a run also ended in an illegal memory access on the
    // H200, cause not found.)
    if (run.all_resident)
      print_costs_in_step(reader, config, o, tokens, budget, scores, run.classes);
    else
      fmt::print("(what each kernel class costs inside the overlapped step is measured with every expert in VRAM)\n");
  }
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
  auto* cmd = app.add_subcommand("bench", "Speed of the CUDA backend on a model, against the GPU's measured limits");
  cmd->add_option("-m,--model", o->model, "GGUF model (for a split model: its first file)")->required();
  cmd->add_option("-p,--prompt", o->prompts, "Prompt lengths to prefill, comma-separated (random ids; default 512)")
      ->delimiter(',')
      ->check(integer_at_least(1));
  cmd->add_option("-n,--generate", o->generate, "Tokens to decode greedily per run (default 128)")
      ->check(integer_at_least(1));
  cmd->add_option("-d,--depth", o->depths, "Context depths to decode at, comma-separated (default 0)")
      ->delimiter(',')
      ->check(integer_at_least(0));
  cmd->add_option("--window", o->windows,
                  "Verify windows to time at each depth, comma-separated token counts (speculative decoding's step: "
                  "that many tokens in one step, each row's greedy token chosen on the device), beside the one-token "
                  "step and the speedup they imply at draft acceptance 0.6, 0.8 and 0.9")
      ->delimiter(',')
      ->check(CLI::Range(int64_t(1), int64_t(64)));
  cmd->add_option("--sequences", o->sequences,
                  "Steps of several sequences to time at each depth, comma-separated counts (serving: every "
                  "sequence's next token in one step, each at the depth), beside the one-token step: tokens per "
                  "second in all and the cost in one-token steps")
      ->delimiter(',')
      ->check(CLI::Range(int64_t(1), int64_t(64)));
  cmd->add_option("--sequence-windows", o->sequence_windows,
                  "With --sequences: steps of every sequence's verify window of each of these token counts too "
                  "(serving with drafts: every draft accepted, sequences x tokens at most 64; the states are kept "
                  "for every row of the largest such step, VRAM that a budget takes from the experts), against "
                  "the steps of one token each and the speedup they imply at draft acceptance 0.6, 0.8 and 0.9; "
                  "on a model with an MTP block (one GPU), also what drafting them costs (the block's steps over "
                  "a row of each sequence, as lode serve drafts) and the speedup with it")
      ->delimiter(',')
      ->check(CLI::Range(int64_t(2), int64_t(64)));
  cmd->add_option("--prompts-together", o->pieces,
                  "Prompts of the first --prompt length read together, comma-separated counts (serving: requests' "
                  "prompts arriving at once; each pass of the prompt path takes as many as fit), beside one at a time")
      ->delimiter(',')
      ->check(CLI::Range(int64_t(2), int64_t(64)));
  cmd->add_option("-r,--repeats", o->repeats, "Timed runs per figure, after a warm-up; the median is shown (default 3)")
      ->check(integer_at_least(1));
  cmd->add_option("--prompt-chunk", o->prompt_chunk,
                  "Prompt tokens per pass through the model (default 4096; fewer when the VRAM budget is tight)")
      ->check(CLI::Range(int64_t(1), int64_t(65535)));
  cmd->add_option("--fill", o->fill,
                  "How a decode depth is reached: prompt (default: a random prompt of that many tokens) or random "
                  "(the cells written with random rows by the format's own writer: a decode step's work depends on "
                  "the depth, not on what the cells hold, and deep contexts are reached in seconds)")
      ->check(CLI::IsMember({"prompt", "random"}));
  cmd->add_option("--ctx", o->ctx, "Positions of K/V to allocate (default: what the runs need)")
      ->check(integer_at_least(1));
  add_kv_option(*cmd, o->kv);
  cmd->add_option("--vram-budget", o->vram_budgets_mib,
                  "MiB of GPU memory lode may use, comma-separated for one set of rows per budget (default: what is "
                  "free, less 5% or 512 MiB)")
      ->delimiter(',')
      ->check(integer_at_least(0));
  add_expert_profile_option(*cmd, o->expert_profile);
  add_expert_swaps_option(*cmd, o->expert_swaps);
  add_miss_path_option(*cmd, o->miss_path);
  cmd->add_option("--gpus", o->gpus,
                  "GPUs to spread the model's layers over, by CUDA index (e.g. 0,1; default: GPU 0 alone), each with "
                  "the --vram-budget; not with --profile yet");
  cmd->add_option("--hand-over", o->hand_over,
                  "With --gpus: how each step's rows cross from one GPU to the next: peer (default: peer copies) or "
                  "nccl (NCCL's send and receive; distinct GPUs, libnccl.so.2 loaded at run time)")
      ->check(CLI::IsMember({"peer", "nccl"}));
  cmd->add_option("--seed", o->seed, "Seed of the random prompt (default 1)");
  cmd->add_flag("--json", o->json, "One JSON object instead of text");
  cmd->add_flag("--profile", o->profile,
                "Also run the longest prompt and a decode once more, waiting for the GPU between phases, and show "
                "where the time goes; then decode as many steps again timed kernel by kernel (per kernel class: "
                "launches, microseconds, bytes moved, GB/s against the copy ceiling); then what each class costs "
                "inside the overlapped step (the step timed without its launches); with --window or --sequences, "
                "a kernel table for each window size and each count of sequences too; with --prompts-together, "
                "where one pass of each count of prompts goes, phase by phase");
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace lode::cli
