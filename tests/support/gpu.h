// GPU tests call LODE_REQUIRE_GPU() first: without a GPU (or without a CUDA build) they skip and
// say why; on the GPU machine they run. With LODE_REQUIRE_GPU=1 in the environment (set it on the
// GPU machine) a test that would skip fails instead, so a missing or unusable GPU cannot pass for
// a green run.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#ifdef LODE_HAVE_CUDA
#include "cuda/device.h"
#endif

namespace lode::test {

inline bool gpu_available(std::string* why) {
#ifdef LODE_HAVE_CUDA
  return !cuda::list_devices(why).empty();
#else
  *why = "lode was built without CUDA (LODE_CUDA=OFF or no nvcc at configure time)";
  return false;
#endif
}

inline bool gpu_required() {
  const char* set = std::getenv("LODE_REQUIRE_GPU");
  return set && std::string(set) == "1";
}

}  // namespace lode::test

#define LODE_REQUIRE_GPU()                                                          \
  do {                                                                              \
    std::string lode_gpu_why;                                                       \
    if (!::lode::test::gpu_available(&lode_gpu_why)) {                              \
      if (::lode::test::gpu_required()) FAIL() << "LODE_REQUIRE_GPU=1, but no GPU: " << lode_gpu_why; \
      GTEST_SKIP() << "no GPU: " << lode_gpu_why;                                   \
    }                                                                               \
  } while (0)
