// What the host processor offers the hand-written SIMD kernels (cpu/*_avx2.cpp), asked once.
#pragma once

namespace lode::cpu {

// AVX2 (which also says the OS saves the registers) and F16C, which every AVX2 processor has but
// which is asked of cpuid directly: not every compiler's __builtin_cpu_supports knows "f16c".
bool host_has_avx2();

}  // namespace lode::cpu
