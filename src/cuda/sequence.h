// The CUDA session as engine::SequenceModel, so generation (lode run) drives it like the CPU one.
#pragma once
#include "cuda/session.h"
#include "engine/generate.h"

namespace lode::cuda {

class CudaSequence final : public engine::SequenceModel {
 public:
  explicit CudaSequence(CudaSession& session) : session_(session) {}
  // The GPU runs a prompt one token at a time for now: `chunk` does not apply.
  std::vector<float> prefill(std::span<const int32_t> tokens, int64_t) override { return session_.prefill(tokens); }
  std::vector<float> decode(int32_t token) override { return session_.decode(token); }
  int64_t position() const override { return session_.position(); }
  int64_t max_context() const override { return session_.max_context(); }

 private:
  CudaSession& session_;
};

}  // namespace lode::cuda
