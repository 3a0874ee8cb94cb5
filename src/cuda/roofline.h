// The device's measured limits, for the fraction-of-ceiling figures of `lode bench`.
#pragma once
#include <cstddef>
#include <functional>

namespace lode::cuda {

class VramAccountant;

// Median milliseconds of `repeats` runs of `work` (queued on the default stream), timed with CUDA
// events after `warmups` untimed runs; fails with the first CUDA error.
double median_event_ms(const std::function<void()>& work, int warmups, int repeats);

// Device-to-device copy bandwidth in GB/s ((read + write bytes) / time, median of `repeats` copies
// of `bytes` after a warm-up), in scratch memory taken from `vram` and released before returning.
double measure_copy_gbps(VramAccountant& vram, size_t bytes = size_t(1) << 30, int repeats = 10);

// Host-to-device bandwidth over PCIe in GB/s, two ways: the copy engine moving `bytes` of pinned
// host memory into VRAM, and kernels reading mapped pinned host memory in place (how the expert
// tier reads absent experts). Median of `repeats` after a warm-up.
double measure_host_to_device_gbps(VramAccountant& vram, size_t bytes = size_t(256) << 20, int repeats = 5);
double measure_mapped_read_gbps(VramAccountant& vram, size_t bytes = size_t(256) << 20, int repeats = 5);
// The same with a device word of the caller's as the probe's sink (no VRAM taken).
double measure_mapped_read_gbps(unsigned* sink, size_t bytes, int repeats);

// Dense matrix-multiply throughput in TFLOP/s on the tensor cores: cuBLAS multiplying square
// matrices of `n` (median of `repeats` after a warm-up), with bf16 inputs or with float32 inputs
// in TF32 (the prompt path's math); float32 sums either way.
enum class MatmulKind { bf16, tf32 };
double measure_matmul_tflops(VramAccountant& vram, MatmulKind kind, int n = 8192, int repeats = 10);

}  // namespace lode::cuda
