// The CUDA session as engine::SequenceModel, so generation (lode run, lode chat) drives it like
// the CPU one. It owns the session.
#pragma once
#include <memory>
#include <string>

#include "cuda/session.h"
#include "engine/generate.h"

namespace lode::cuda {

class CudaSequence final : public engine::SequenceModel {
 public:
  explicit CudaSequence(std::unique_ptr<CudaSession> session) : session_(std::move(session)) {}
  // Prompts go through the GPU's prompt pass in its own chunks: `chunk` does not apply.
  std::vector<float> prefill(std::span<const int32_t> tokens, int64_t) override { return session_->prefill(tokens); }
  std::vector<float> prefill_all(std::span<const int32_t> tokens, int64_t) override {
    return session_->prefill(tokens, true);
  }
  std::vector<float> decode(int32_t token) override { return session_->decode(token); }
  void reset() override { session_->reset(); }
  int64_t position() const override { return session_->position(); }
  int64_t max_context() const override { return session_->max_context(); }
  int64_t vocab() const override { return session_->vocab(); }
  // "experts: 4719 of 10240 in VRAM, hit rate 54.9%, 1.2 GB over PCIe (decode 0.9, prompts 0.3), 1008 swaps".
  std::string activity() const override;

 private:
  std::unique_ptr<CudaSession> session_;
};

}  // namespace lode::cuda
