// The GPU probes' status check: a CUDA or cuBLASLt call that returns nonzero ends the probe with
// the call, its status and its line.
#pragma once

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                     \
  do {                                                                            \
    auto e_ = (x);                                                                \
    if (e_ != 0) {                                                                \
      std::fprintf(stderr, "%s failed (%d) at line %d\n", #x, int(e_), __LINE__); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)
