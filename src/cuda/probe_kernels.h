// Kernels for measuring the machine (cuda/roofline.h), not for the model. No CUDA types here.
#pragma once
#include <cstddef>

namespace lode::cuda {

// Reads `bytes` (a multiple of 16) at `data` once, 16 bytes per load, on the default stream (the
// mapped-read probe: data is pinned host memory seen by the device); `sink` is one device word it
// may write so the loads are kept. Null when queued, else the CUDA runtime's message.
const char* read_in_place(const void* data, size_t bytes, unsigned* sink);

}  // namespace lode::cuda
