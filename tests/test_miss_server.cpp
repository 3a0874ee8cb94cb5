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

TEST(MissServer, AnswersEachRequestWithTheHostExpertsProducts) {
  const Mini m;
  lode::cpu::HostExperts served(m.weights, 2), reference(m.weights, 1);
  MissMailbox box;
  std::vector<float> x(static_cast<size_t>(m.hidden)), y(static_cast<size_t>(kMaxMissExperts * m.hidden));
  lode::cuda::MissServer server(m.weights, served, box, x.data(), y.data());
  const int64_t layers = m.weights.config.n_layers, experts = m.weights.config.n_experts;
  for (int r = 0; r < 12; ++r) {
    const int32_t layer = int32_t(r % layers);
    std::vector<int32_t> chosen;
    for (int i = 0; i <= r % 4; ++i) chosen.push_back(int32_t((r * 5 + i * 3) % experts));
    const std::vector<float> input = input_of(m.hidden, float(r));
    post(box, x, layer, chosen, input);
    ASSERT_TRUE(answered(box)) << "request " << r;
    std::vector<float> want(chosen.size() * size_t(m.hidden));
    reference.compute(layer, chosen.data(), int(chosen.size()), input.data(), want.data());
    EXPECT_EQ(std::memcmp(y.data(), want.data(), want.size() * 4), 0) << "request " << r;
  }
  EXPECT_EQ(server.counts().requests, 12u);
  EXPECT_TRUE(server.caught_up(0s));
}

TEST(MissServer, ReadsAheadTheExpertsAHintNames) {
  const Mini m;
  lode::cpu::HostExperts served(m.weights, 2);
  MissMailbox box;
  std::vector<float> x(static_cast<size_t>(m.hidden)), y(static_cast<size_t>(kMaxMissExperts * m.hidden));
  lode::cuda::MissServer server(m.weights, served, box, x.data(), y.data());
  box.hint_layer = 1, box.hint_count = 3;
  box.hint_expert[0] = 2, box.hint_expert[1] = 5, box.hint_expert[2] = 9;
  std::atomic_ref<uint32_t>(box.hint).store(1, std::memory_order_release);
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (server.counts().read_ahead_bytes == 0 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  EXPECT_GT(server.counts().read_ahead_bytes, 0u);
  EXPECT_EQ(server.counts().requests, 0u);
}

// A step that stopped waiting for an answer (a timeout) leaves the request to the server:
// caught_up() waits until it has been answered, and the next request then gets its own answer.
TEST(MissServer, CatchesUpWithARequestAStepStoppedWaitingFor) {
  const Mini m;
  lode::cpu::HostExperts served(m.weights, 2), reference(m.weights, 1);
  MissMailbox box;
  std::vector<float> x(static_cast<size_t>(m.hidden)), y(static_cast<size_t>(kMaxMissExperts * m.hidden));
  lode::cuda::MissServer server(m.weights, served, box, x.data(), y.data());
  post(box, x, 0, {3, 6, 2, 8}, input_of(m.hidden, 1.0f));
  EXPECT_TRUE(server.caught_up(20s));
  EXPECT_EQ(std::atomic_ref<uint32_t>(box.done).load(), 1u);
  const std::vector<int32_t> chosen = {4, 7, 1};
  const std::vector<float> input = input_of(m.hidden, 0.5f);
  post(box, x, 1, chosen, input);
  ASSERT_TRUE(answered(box));
  std::vector<float> want(chosen.size() * size_t(m.hidden));
  reference.compute(1, chosen.data(), int(chosen.size()), input.data(), want.data());
  EXPECT_EQ(std::memcmp(y.data(), want.data(), want.size() * 4), 0);
  EXPECT_EQ(server.counts().requests, 2u);
}

}  // namespace

#else
TEST(MissServer, NeedsACudaBuild) { LODE_REQUIRE_GPU(); }
#endif
