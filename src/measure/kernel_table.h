// `lode bench --profile`'s kernel-by-kernel table of a decode step: per kernel class, launches,
// microseconds, share of the step, the bytes it must move and its GB/s against the copy ceiling
// measured in the same run, slowest first: the list the decode work goes down. No CUDA here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/step_profile.h"

namespace lode::measure {

// `classes` over `steps` timed steps at the depth given; copy_gbps: the device copy ceiling (0:
// not measured, no column). Classes that move no bytes of note print none.
std::string kernel_table_text(std::vector<cuda::KernelClassTime> classes, int64_t steps, int64_t depth,
                              double copy_gbps);

}  // namespace lode::measure
