// The CPU miss path's host end (cuda/miss_server.h) without a GPU: a thread of the test plays the
// decode step's dispatch and gather kernels on a mailbox in ordinary memory. Each answer is the
// host experts' own products for the request's layer and experts (with each of a step's rows that
// chose them, for steps of several rows); a hint makes the server read ahead; and after a request a step stopped waiting for (a timeout), caught_up() says when the
// server has answered it, so that the mailbox is in step for the next step. Runs in the CUDA build
// (the miss path is part of it).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "support/gpu.h"
#include "support/paths.h"

#ifdef LODE_HAVE_CUDA
#include "cpu/host_experts.h"
#include "cuda/miss_server.h"
#include "gguf/reader.h"
#include "model/weights.h"

namespace {

using lode::cuda::kernels::kMaxMissExperts;
using lode::cuda::kernels::kMaxMissPairs;
using lode::cuda::kernels::kMaxMissRows;
using lode::cuda::kernels::MissMailbox;
using namespace std::chrono_literals;

struct Mini {
  lode::gguf::Reader reader{lode::test::mini_model_path()};
  lode::model::ModelWeights weights =
      lode::model::bind_weights(reader, lode::model::read_config(reader.metadata()));
  int64_t hidden = weights.config.hidden;
};

// The dispatch kernel's side: the request's fields (each expert with its rows of the step), the
// rows' x, then its number.
void post(MissMailbox& box, std::vector<float>& x, int32_t layer, const std::vector<int32_t>& experts,
          const std::vector<uint64_t>& rows, const std::vector<float>& input, bool grouped = false) {
  box.layer = layer, box.count = int32_t(experts.size()), box.hinted = 0, box.grouped = grouped ? 1 : 0;
  std::copy(experts.begin(), experts.end(), box.expert);
  std::copy(rows.begin(), rows.end(), box.rows);
  std::copy(input.begin(), input.end(), x.begin());
  std::atomic_ref<uint32_t>(box.request).fetch_add(1, std::memory_order_release);
}

// A one-token step's request: every expert with row 0.
void post(MissMailbox& box, std::vector<float>& x, int32_t layer, const std::vector<int32_t>& experts,
          const std::vector<float>& input) {
  post(box, x, layer, experts, std::vector<uint64_t>(experts.size(), 1), input);
}

// The gather kernel's side: waits for the answer to the last request (at most 20 s).
bool answered(const MissMailbox& box) {
  const auto until = std::chrono::steady_clock::now() + 20s;
  std::atomic_ref<uint32_t> done(const_cast<uint32_t&>(box.done)), request(const_cast<uint32_t&>(box.request));
  while (done.load(std::memory_order_acquire) != request.load(std::memory_order_acquire))
    if (std::chrono::steady_clock::now() > until) return false;
  return true;
}

std::vector<float> input_of(int64_t hidden, float phase) {
  std::vector<float> x(static_cast<size_t>(hidden));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(phase + 0.37f * float(i)) * 0.8f;
  return x;
}

// lode-mini's experts served from a mailbox of the test's own, with a second HostExperts to
// compute the answers expected.
struct Served {
  Mini m;
  lode::cpu::HostExperts host{m.weights, 2, kMaxMissPairs, kMaxMissRows}, reference{m.weights, 1};
  MissMailbox box;
  std::vector<float> x = std::vector<float>(static_cast<size_t>(kMaxMissRows * m.hidden)),
                     y = std::vector<float>(static_cast<size_t>(kMaxMissPairs * m.hidden));
  lode::cuda::MissServer server{m.weights, host, box, x.data(), y.data()};

  // Posts a request, waits for its answer and checks it against the reference's products.
  void expect_answer(int32_t layer, const std::vector<int32_t>& chosen, const std::vector<float>& input) {
    post(box, x, layer, chosen, input);
    ASSERT_TRUE(answered(box));
    std::vector<float> want(chosen.size() * size_t(m.hidden));
    reference.compute(layer, chosen.data(), int(chosen.size()), input.data(), want.data());
    EXPECT_EQ(std::memcmp(y.data(), want.data(), want.size() * 4), 0) << "layer " << layer;
  }
};

TEST(MissServer, AnswersEachRequestWithTheHostExpertsProducts) {
  Served s;
  const int64_t layers = s.m.weights.config.n_layers, experts = s.m.weights.config.n_experts;
  for (int r = 0; r < 12; ++r) {
    std::vector<int32_t> chosen;
    for (int i = 0; i <= r % 4; ++i) chosen.push_back(int32_t((r * 5 + i * 3) % experts));
    s.expect_answer(int32_t(r % layers), chosen, input_of(s.m.hidden, float(r)));
  }
  EXPECT_EQ(s.server.counts().requests, 12u);
  EXPECT_TRUE(s.server.caught_up(0s));
}

// A step of several rows sends each expert with the rows that chose it: the answer holds every
// (expert, row) pair, expert after expert and each one's rows ascending, each the products of that
// expert on that row's x alone.
TEST(MissServer, AnswersEachExpertForEachOfItsRows) {
  Served s;
  const int64_t h = s.m.hidden, experts = s.m.weights.config.n_experts;
  const int rows = 40;
  std::vector<float> input(static_cast<size_t>(rows * h));
  for (int r = 0; r < rows; ++r) {
    const std::vector<float> row = input_of(h, 0.3f * float(r));
    std::copy(row.begin(), row.end(), input.begin() + r * h);
  }
  const std::vector<int32_t> chosen = {int32_t(experts - 1), 4, 0, 9};
  const std::vector<uint64_t> rows_of = {1ull << 39 | 1ull << 2, 1ull << 7, 0x5ull, 1ull << 20 | 1ull << 21 | 1ull << 38};
  post(s.box, s.x, 1, chosen, rows_of, input, true);
  ASSERT_TRUE(answered(s.box));
  size_t pair = 0;
  for (size_t i = 0; i < chosen.size(); ++i)
    for (int r = 0; r < rows; ++r) {
      if (!(rows_of[i] >> r & 1)) continue;
      std::vector<float> want(static_cast<size_t>(h));
      s.reference.compute(1, &chosen[i], 1, input.data() + r * h, want.data());
      EXPECT_EQ(std::memcmp(s.y.data() + pair * size_t(h), want.data(), want.size() * 4), 0)
          << "expert " << chosen[i] << ", row " << r;
      ++pair;
    }
  EXPECT_EQ(pair, 8u);
  EXPECT_EQ(s.server.counts().pairs, 8u);
  EXPECT_EQ(s.server.counts().experts, 4u);
  EXPECT_EQ(s.server.counts().pair_bytes, 2 * s.server.counts().expert_bytes);  // (4 experts, 8 pairs, one layer)
  // A grouped step's reads are counted by group on the device, less the CPU's: its pairs are not
  // the one-token steps' routings the session takes the CPU's bytes from.
  EXPECT_EQ(s.server.counts().token_pair_bytes, 0u);
  const uint64_t grouped_bytes = s.server.counts().pair_bytes;
  post(s.box, s.x, 1, {5, 6}, input);  // a one-token step's request
  ASSERT_TRUE(answered(s.box));
  EXPECT_GT(s.server.counts().token_pair_bytes, 0u);
  EXPECT_EQ(s.server.counts().token_pair_bytes, s.server.counts().pair_bytes - grouped_bytes);
}

TEST(MissServer, ReadsAheadTheExpertsAHintNames) {
  Served s;
  s.box.hint_layer = 1, s.box.hint_count = 3;
  s.box.hint_expert[0] = 2, s.box.hint_expert[1] = 5, s.box.hint_expert[2] = 9;
  std::atomic_ref<uint32_t>(s.box.hint).store(1, std::memory_order_release);
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (s.server.counts().read_ahead_bytes == 0 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  EXPECT_GT(s.server.counts().read_ahead_bytes, 0u);
  EXPECT_EQ(s.server.counts().requests, 0u);
}

// A step that stopped waiting for an answer (a timeout) leaves the request to the server:
// caught_up() waits until it has been answered, and the next request then gets its own answer.
TEST(MissServer, CatchesUpWithARequestAStepStoppedWaitingFor) {
  Served s;
  post(s.box, s.x, 0, {3, 6, 2, 8}, input_of(s.m.hidden, 1.0f));
  EXPECT_TRUE(s.server.caught_up(20s));
  EXPECT_EQ(std::atomic_ref<uint32_t>(s.box.done).load(), 1u);
  s.expect_answer(1, {4, 7, 1}, input_of(s.m.hidden, 0.5f));
  EXPECT_EQ(s.server.counts().requests, 2u);
}

// A request read while the device rewrote it (a step that stopped waiting, then later layers'
// requests over it) can name more pairs than a request holds, or no layer: the server leaves it
// unanswered (the step's gather then times out with its clear error) instead of ending the process,
// as HostExperts' refusal thrown on the server's thread did; the next request is answered.
TEST(MissServer, LeavesATornRequestUnansweredAndAnswersTheNext) {
  Served s;
  const std::vector<float> input(static_cast<size_t>(kMaxMissRows * s.m.hidden), 0.25f);
  post(s.box, s.x, 0, {1, 2}, {~0ull, ~0ull}, input);  // 128 pairs
  EXPECT_FALSE(s.server.caught_up(200ms));
  post(s.box, s.x, int32_t(s.m.weights.config.n_layers), {1}, {1}, input);  // a layer past the last
  EXPECT_FALSE(s.server.caught_up(200ms));
  s.expect_answer(1, {4, 7, 1}, input_of(s.m.hidden, 0.5f));
  EXPECT_EQ(s.server.counts().requests, 1u);
  EXPECT_EQ(s.server.counts().pairs, 3u);
}

}  // namespace

#else
TEST(MissServer, NeedsACudaBuild) { LODE_REQUIRE_GPU(); }
#endif
