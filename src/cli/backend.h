// The engine a command runs a sequence on: the CPU session of a loaded model, or a CUDA session on
// its weights (`--backend cpu|cuda`), behind engine::SequenceModel so that generation drives both
// alike. Used by `lode run` and `lode chat`.
#pragma once
#include <memory>
#include <string>

#include "cli/loaded_model.h"
#include "engine/generate.h"

namespace CLI {
class App;
}

namespace lode::cli {

// Adds --backend to a command, defaulting to cpu.
void add_backend_option(CLI::App& cmd, std::string& backend);

// The sequence of `backend` ("cpu" or "cuda"). On the GPU, K/V is kept for `ctx` positions (0:
// the model's context, at most 8192). Fails clearly when lode was built without CUDA or there is
// no usable GPU.
std::unique_ptr<engine::SequenceModel> open_sequence(const std::string& backend, LoadedModel& model, int64_t ctx);

}  // namespace lode::cli
