// What the host processor offers the hand-written SIMD code (cpu/*_avx2.cpp, the f16 rows of
// core/quant/float.cpp), asked once.
#pragma once

namespace lode {

// AVX2 (which also says the OS saves the registers) and F16C, which every AVX2 processor has but
// which is asked of cpuid directly: not every compiler's __builtin_cpu_supports knows "f16c".
bool host_has_avx2();

}  // namespace lode
