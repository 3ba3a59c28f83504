// What the test machine's CPU has, for the tests that pick kernels by instruction set.
#pragma once

#include <cpuid.h>

namespace specdec::test {

// F16C is read from CPUID leaf 1 (ECX bit 29): clang does not take "f16c" in __builtin_cpu_supports.
inline bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

}  // namespace specdec::test
