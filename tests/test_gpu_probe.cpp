#include "support/gpu.h"

// Checks the probe itself on the GPU machine; elsewhere it shows how GPU tests skip.
TEST(GpuProbe, ListsTheDevicesWithMemory) {
  LODE_REQUIRE_GPU();
#ifdef LODE_HAVE_CUDA
  std::string why;
  const auto devices = lode::cuda::list_devices(&why);
  ASSERT_FALSE(devices.empty());
  for (const auto& d : devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.total_bytes, size_t(1) << 30);
    EXPECT_LE(d.free_bytes, d.total_bytes);
    EXPECT_GE(d.cc_major, 7);
  }
#endif
}
