// The CPU miss path's host side, without a GPU: HostExperts (cpu/host_experts.h) computes an
// expert as down(swiglu(gate x, up x)) with the twin's products, split over a spinning pool in
// any number of threads with the same bits; SpinPool runs every task once; MissSplit's table.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "core/exact_math.h"
#include "cpu/host_experts.h"
#include "cpu/q8_twin.h"
#include "cpu/spin_pool.h"
#include "gguf/reader.h"
#include "model/matrix_view.h"
#include "model/weights.h"
#include "plan/miss_split.h"
#include "support/paths.h"

namespace {

namespace twin = lode::cpu::q8twin;

// One expert by the twin's row_dot, row after row, in one thread.
std::vector<float> expert_by_row_dot(const lode::model::MoeWeights& m, int32_t e, const std::vector<float>& x) {
  const lode::model::MatrixView gate = m.gate.expert(e), up = m.up.expert(e), down = m.down.expert(e);
  twin::RoundedBuffer gx(gate.cols), ux(up.cols), dx(down.cols);
  twin::round(gate.type->type, x.data(), nullptr, gate.cols, gx.x());
  twin::round(up.type->type, x.data(), nullptr, up.cols, ux.x());
  std::vector<float> g(static_cast<size_t>(gate.rows)), u(static_cast<size_t>(up.rows));
  for (int64_t r = 0; r < gate.rows; ++r) g[size_t(r)] = twin::row_dot(gate.type->type, gate.row(r), gate.cols, gx.x());
  for (int64_t r = 0; r < up.rows; ++r) u[size_t(r)] = twin::row_dot(up.type->type, up.row(r), up.cols, ux.x());
  twin::round(down.type->type, g.data(), u.data(), down.cols, dx.x());
  std::vector<float> y(static_cast<size_t>(down.rows));
  for (int64_t r = 0; r < down.rows; ++r) y[size_t(r)] = twin::row_dot(down.type->type, down.row(r), down.cols, dx.x());
  return y;
}

// The same expert in double precision from the dequantized weights (no rounding of x).
std::vector<double> expert_in_double(const lode::model::MoeWeights& m, int32_t e, const std::vector<float>& x) {
  const auto product = [](const lode::model::MatrixView& w, const std::vector<double>& in) {
    std::vector<double> out(static_cast<size_t>(w.rows));
    std::vector<float> row(static_cast<size_t>(w.cols));
    for (int64_t r = 0; r < w.rows; ++r) {
      lode::model::dequantize_row(w, r, row.data());
      for (int64_t c = 0; c < w.cols; ++c) out[size_t(r)] += double(row[size_t(c)]) * in[size_t(c)];
    }
    return out;
  };
  const std::vector<double> xd(x.begin(), x.end());
  const std::vector<double> g = product(m.gate.expert(e), xd), u = product(m.up.expert(e), xd);
  std::vector<double> h(g.size());
  for (size_t i = 0; i < g.size(); ++i) h[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return product(m.down.expert(e), h);
}

TEST(HostExperts, AreTheTwinsProductsInAnyNumberOfThreads) {
  const lode::gguf::Reader reader(lode::test::mini_model_path());
  const lode::model::ModelWeights weights = lode::model::bind_weights(reader, lode::model::read_config(reader.metadata()));
  ASSERT_EQ(lode::cpu::HostExperts::unsupported(weights), "");
  const auto& c = weights.config;
  std::vector<float> x(static_cast<size_t>(c.hidden));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i)) * 0.8f;
  const std::vector<int32_t> experts = {3, 0, int32_t(c.n_experts - 1), 7};
  for (int threads : {1, 3}) {
    lode::cpu::HostExperts host(weights, threads);
    for (int64_t layer : {int64_t(0), c.n_layers - 1}) {
      std::vector<float> y(experts.size() * size_t(c.hidden), -1.0f);
      host.compute(layer, experts.data(), int(experts.size()), x.data(), y.data());
      const lode::model::MoeWeights& m = weights.layers[size_t(layer)].moe;
      for (size_t i = 0; i < experts.size(); ++i) {
        const std::vector<float> want = expert_by_row_dot(m, experts[i], x);
        ASSERT_EQ(std::memcmp(want.data(), y.data() + i * size_t(c.hidden), want.size() * 4), 0)
            << threads << " threads, layer " << layer << ", expert " << experts[i];
        // And it is the expert's function: within the 8-bit rounding of the inputs.
        const std::vector<double> exact = expert_in_double(m, experts[i], x);
        double err = 0, norm = 0;
        for (size_t r = 0; r < exact.size(); ++r) {
          err += std::pow(double(want[r]) - exact[r], 2);
          norm += exact[r] * exact[r];
        }
        EXPECT_LT(std::sqrt(err / norm), 0.03) << "layer " << layer << ", expert " << experts[i];
      }
    }
  }
}

// A prefetch asks stop() once per piece of the experts' bytes (64 KiB pieces of each matrix), takes
// none once it says stop, and changes nothing compute() gives.
TEST(HostExperts, PrefetchVisitsEveryPieceOnceAndChangesNothing) {
  const lode::gguf::Reader reader(lode::test::mini_model_path());
  const lode::model::ModelWeights weights = lode::model::bind_weights(reader, lode::model::read_config(reader.metadata()));
  const auto& c = weights.config;
  std::vector<float> x(static_cast<size_t>(c.hidden));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.21f * float(i)) * 0.6f;
  const std::vector<int32_t> experts = {5, 1, 2};
  const int64_t layer = c.n_layers / 2;
  const lode::model::MoeWeights& m = weights.layers[size_t(layer)].moe;
  int64_t pieces = 0, bytes = 0;
  for (const lode::model::ExpertStack* s : {&m.gate, &m.up, &m.down}) {
    pieces += (s->first.rows * int64_t(s->first.row_bytes) + (64 << 10) - 1) / (64 << 10);
    bytes += s->first.rows * int64_t(s->first.row_bytes);
  }
  lode::cpu::HostExperts host(weights, 3);
  std::vector<float> before(experts.size() * size_t(c.hidden)), after(before.size());
  host.compute(layer, experts.data(), int(experts.size()), x.data(), before.data());
  std::atomic<int64_t> asked{0};
  const int64_t read = host.prefetch(layer, experts.data(), int(experts.size()), [&] { return asked.fetch_add(1) < 0; });
  EXPECT_EQ(asked.load(), pieces * int64_t(experts.size()));
  EXPECT_EQ(read, bytes * int64_t(experts.size()));
  // Told to stop at once, it reads nothing.
  EXPECT_EQ(host.prefetch(layer, experts.data(), int(experts.size()), [] { return true; }), 0);
  host.compute(layer, experts.data(), int(experts.size()), x.data(), after.data());
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * 4), 0);
  asked = 0;
  host.prefetch(layer, experts.data(), 0, [&] { return ++asked, false; });
  EXPECT_EQ(asked.load(), 0);
}

TEST(SpinPool, RunsEveryTaskOnceAndAgain) {
  lode::cpu::SpinPool pool(4);
  std::vector<std::atomic<int>> hits(1000);
  for (int round = 0; round < 200; ++round) {
    const int64_t tasks = 1 + round * 5 % 1000;
    pool.run(tasks, [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
    for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(hits[size_t(i)].exchange(0), i < tasks ? 1 : 0) << round << " " << i;
  }
}

// Many more threads than cores, so that the scheduler often stops one between reading the claim
// word of a run that has just finished and claiming: such a thread must not run a task of the
// next run. Each run's tasks each run once. A stress, so it catches a race only now and then: the
// pool with one job slot for every run (a late thread could read the next run's count and
// function before that run was published, and claim one of its tasks, which the run then gave out
// again) ran a task twice 11 times in 3 million such runs with 8 threads on the 2-core build box,
// and in 1 of 5 tries of 500,000.
TEST(SpinPool, ThreadsLateFromAFinishedRunNeverRunTheNextOnesTasks) {
  const int threads = std::clamp(4 * int(std::thread::hardware_concurrency()), 8, 16);
  lode::cpu::SpinPool pool(threads);
  constexpr int64_t kMostTasks = 13;
  std::array<std::atomic<int>, kMostTasks> hits{};
  for (int64_t run = 0; run < 300000; ++run) {
    const int64_t tasks = 1 + run * 7 % kMostTasks;
    pool.run(tasks, [&](int64_t i) { hits[size_t(i)].fetch_add(1, std::memory_order_relaxed); });
    for (int64_t i = 0; i < kMostTasks; ++i)
      ASSERT_EQ(hits[size_t(i)].exchange(0), i < tasks ? 1 : 0) << "run " << run << ", task " << i << " of " << tasks;
  }
}

TEST(MissSplit, TheTableFollowsTheCostsAndThePath) {
  using lode::plan::MissPath;
  using lode::plan::MissSplit;
  const lode::plan::MissCosts costs{.cpu_request_us = 10, .cpu_expert_us = 40, .gpu_expert_us = 40};
  const MissSplit cpu(MissPath::cpu, 8, costs), gpu(MissPath::gpu, 8, costs), split(MissPath::automatic, 8, costs);
  for (int m = 0; m <= 8; ++m) {
    EXPECT_EQ(cpu.shares()[size_t(m)], m);
    EXPECT_EQ(gpu.shares()[size_t(m)], 0);
    const int s = split.shares()[size_t(m)];
    // Even costs: about half, never more than the GPU's side would take.
    EXPECT_LE(s, m / 2 + 1) << m;
    EXPECT_GE(s, (m - 1) / 2) << m;
  }
  // A CPU four times as fast takes most of them.
  const MissSplit fast(MissPath::automatic, 8, {.cpu_request_us = 0, .cpu_expert_us = 10, .gpu_expert_us = 40});
  EXPECT_GE(fast.shares()[8], 6);
  // Steps of several rows have more absent experts than a token routes: the table goes on to `most`.
  const MissSplit rows(MissPath::automatic, 8, costs, 32);
  ASSERT_EQ(rows.shares().size(), 33u);
  for (int m = 0; m <= 8; ++m) EXPECT_EQ(rows.shares()[size_t(m)], split.shares()[size_t(m)]) << m;
  for (int m = 9; m <= 32; ++m) {
    EXPECT_GE(rows.shares()[size_t(m)], rows.shares()[size_t(m - 1)]) << m;
    EXPECT_LE(rows.shares()[size_t(m)], m / 2 + 1) << m;
  }
  // A step of 16 rows under a budget has about 60 absent experts a layer: the CPU's share goes on
  // growing past 32 (the H200's costs: a request 22 us + 19 us an expert, 37 us an expert over
  // PCIe; balanced at 39 of 60). Until stop 74 such a step read the share of 32.
  const MissSplit h200(MissPath::automatic, 8, {.cpu_request_us = 22, .cpu_expert_us = 19, .gpu_expert_us = 37}, 512);
  ASSERT_EQ(h200.shares().size(), 513u);
  EXPECT_EQ(h200.shares()[32], 21);
  EXPECT_EQ(h200.shares()[60], 39);
  EXPECT_EQ(h200.shares()[512], 338);  // (22 + 19 c against 37 (512 - c): even at 337.9)
}

TEST(MissSplit, TuningKeepsWhatDecodesFaster) {
  using lode::plan::MissSplit;
  MissSplit split(lode::plan::MissPath::automatic, 8, {.cpu_request_us = 10, .cpu_expert_us = 40, .gpu_expert_us = 40});
  // Steps get faster the more the CPU takes: the tuning should lower the CPU's weight over time.
  const auto step_time = [&] { return 1.0 - 0.01 * split.shares()[8]; };
  const int before = split.shares()[8];
  for (int i = 0; i < 40 * MissSplit::kWindow; ++i) split.observe_step(step_time());
  EXPECT_GT(split.shares()[8], before);
  EXPECT_LT(split.cpu_weight(), 1.0);
  // With the table going on past k (steps of several rows), every change of the table changes what
  // one-token steps read (m <= k), whose times alone judge a trial.
  MissSplit wide(lode::plan::MissPath::automatic, 8, {.cpu_request_us = 10, .cpu_expert_us = 40, .gpu_expert_us = 40}, 32);
  for (int i = 0; i < 40 * MissSplit::kWindow; ++i) {
    const std::vector<int32_t> shares = wide.shares();
    if (wide.observe_step(1.0 - 0.01 * shares[8]))
      ASSERT_FALSE(std::equal(shares.begin(), shares.begin() + 9, wide.shares().begin())) << "step " << i;
  }
  EXPECT_GT(wide.shares()[8], before);
  // Never changes for a fixed path.
  MissSplit fixed(lode::plan::MissPath::cpu, 8, {});
  for (int i = 0; i < 4 * MissSplit::kWindow; ++i) EXPECT_FALSE(fixed.observe_step(1.0));
}

}  // namespace
