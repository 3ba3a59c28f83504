// What the test machine's CPU has, for the tests that pick kernels by instruction set.
#pragma once

#include <cpuid.h>

namespace specdec::test {

// F16C is read from CPUID leaf 1 (ECX bit 29): clang does not take "f16c" in __builtin_cpu_supports.
inline bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

// The "amx" kernels' needs: AVX-512 F/BW/VL/DQ and BF16, plus AMX-BF16 and AMX-TILE
// (CPUID.(EAX=7, ECX=0):EDX bits 22 and 24). Whether Linux grants the tile state is the backend's
// check.
inline bool cpu_has_amx() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bf16") && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) &&
         (edx & (1u << 22)) != 0 && (edx & (1u << 24)) != 0;
}

}  // namespace specdec::test
