// How the CPU engine computes: threads, and what happens to activations entering a matrix product.
#pragma once

#include "model/activations.h"

namespace lode::cpu {

struct Compute {
  int threads = 0;  // OpenMP threads; 0: OpenMP's default
  model::Activations activations = model::Activations::f32;

  int resolved_threads() const;  // threads, or OpenMP's default when 0
};

}  // namespace lode::cpu
