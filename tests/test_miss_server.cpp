// The CPU miss path's host end (cuda/miss_server.h) without a GPU: a thread of the test plays the
// decode step's dispatch and gather kernels on a mailbox in ordinary memory. Each answer is the
// host experts' own products for the request's layer and experts; a hint makes the server read
// ahead; and after a request a step stopped waiting for (a timeout), caught_up() says when the
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
using lode::cuda::kernels::MissMailbox;
using namespace std::chrono_literals;

struct Mini {
  lode::gguf::Reader reader{lode::test::mini_model_path()};
  lode::model::ModelWeights weights =
      lode::model::bind_weights(reader, lode::model::read_config(reader.metadata()));
  int64_t hidden = weights.config.hidden;
};

// The dispatch kernel's side: the request's fields, its x, then its number.
void post(MissMailbox& box, std::vector<float>& x, int32_t layer, const std::vector<int32_t>& experts,
          const std::vector<float>& input) {
  box.layer = layer, box.count = int32_t(experts.size()), box.hinted = 0;
  std::copy(experts.begin(), experts.end(), box.expert);
  x = input;
  std::atomic_ref<uint32_t>(box.request).fetch_add(1, std::memory_order_release);
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
  lode::cpu::HostExperts host{m.weights, 2}, reference{m.weights, 1};
  MissMailbox box;
  std::vector<float> x = std::vector<float>(static_cast<size_t>(m.hidden)),
                     y = std::vector<float>(static_cast<size_t>(kMaxMissExperts * m.hidden));
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

}  // namespace

#else
TEST(MissServer, NeedsACudaBuild) { LODE_REQUIRE_GPU(); }
#endif
