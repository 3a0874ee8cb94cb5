// `lode bench --profile`'s kernel-by-kernel tables of a decode step. The first: per kernel class,
// launches, microseconds (an event after each kernel), share of the step, the bytes it must move
// and its GB/s against the copy ceiling measured in the same run, slowest first. The second: what
// each class costs inside the real step, whose launches overlap: the time a step saves without
// it. No CUDA here.
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

// A decode step without one kernel class's launches.
struct StepWithout {
  std::string name;         // the class's launch name (cuda::KernelClassTime::launch)
  double launches = 0;      // its launches a step
  double step_seconds = 0;  // a step's time without them
};
// Each class's cost inside the step, full_step_seconds less its step_seconds, most first (a class
// whose absence does not make the step faster costs nothing or less: the overlap hid it).
std::string step_cost_table_text(double full_step_seconds, std::vector<StepWithout> rows, int64_t depth);

}  // namespace lode::measure
