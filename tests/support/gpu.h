// GPU tests call LODE_REQUIRE_GPU() first: without a GPU (or without a CUDA build) they skip and
// say why; on the GPU machine they run.
#pragma once
#include <gtest/gtest.h>

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

}  // namespace lode::test

#define LODE_REQUIRE_GPU()                                              \
  do {                                                                  \
    std::string lode_gpu_why;                                           \
    if (!::lode::test::gpu_available(&lode_gpu_why))                    \
      GTEST_SKIP() << "no GPU: " << lode_gpu_why;                       \
  } while (0)
