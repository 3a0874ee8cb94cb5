#include "cli/backend.h"

#include <CLI/CLI.hpp>

#include <algorithm>

#include "core/error.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/sequence.h"
#endif

namespace lode::cli {

void add_vram_budget_option(CLI::App& cmd, int64_t& mib) {
  cmd.add_option("--vram-budget", mib,
                 "MiB of GPU memory lode may use (default: what is free, less 5% or 512 MiB); a model that does "
                 "not fit is refused, saying by how much")
      ->check(CLI::NonNegativeNumber);
}

void add_backend_options(CLI::App& cmd, BackendOptions& o) {
  cmd.add_option("--backend", o.backend,
                 "cpu (default) or cuda: the whole model on the GPU (--ctx defaults to at most 8192 there)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  add_vram_budget_option(cmd, o.vram_budget_mib);
}

std::unique_ptr<engine::SequenceModel> open_sequence(const BackendOptions& o, LoadedModel& model,
                                                     const ModelRunOptions& run) {
  if (o.backend == "cpu") return std::make_unique<engine::CpuSequence>(model.session);
#ifdef LODE_HAVE_CUDA
  cuda::CudaSessionOptions options;
  options.max_context = run.ctx > 0 ? run.ctx : std::min<int64_t>(model.config.context_length, 8192);
  options.vram_budget = size_t(o.vram_budget_mib) << 20;
  options.activations = run.activations_or(cpu::Activations::q8);
  return std::make_unique<cuda::CudaSequence>(std::make_unique<cuda::CudaSession>(model.reader, model.config, options));
#else
  fail("--backend cuda: this lode was built without CUDA (configure with LODE_CMAKE_ARGS=-DLODE_CUDA=ON)");
#endif
}

}  // namespace lode::cli
