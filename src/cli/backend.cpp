#include "cli/backend.h"

#include <CLI/CLI.hpp>

#include <algorithm>

#include "core/error.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/sequence.h"
#endif

namespace lode::cli {

void add_backend_option(CLI::App& cmd, std::string& backend) {
  cmd.add_option("--backend", backend,
                 "cpu (default) or cuda: the whole model on the GPU (--ctx defaults to at most 8192 there)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

std::unique_ptr<engine::SequenceModel> open_sequence(const std::string& backend, LoadedModel& model, int64_t ctx) {
  if (backend == "cpu") return std::make_unique<engine::CpuSequence>(model.session);
#ifdef LODE_HAVE_CUDA
  const int64_t positions = ctx > 0 ? ctx : std::min<int64_t>(model.config.context_length, 8192);
  return std::make_unique<cuda::CudaSequence>(std::make_unique<cuda::CudaSession>(
      model.reader, model.config, cuda::CudaSessionOptions{.max_context = positions}));
#else
  fail("--backend cuda: this lode was built without CUDA (configure with LODE_CMAKE_ARGS=-DLODE_CUDA=ON)");
#endif
}

}  // namespace lode::cli
