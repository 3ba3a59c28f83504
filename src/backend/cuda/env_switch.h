// The CUDA backend's on/off switches read from the environment (SPECDEC_CUDA_*), kept for
// debugging and for measuring what each optimisation buys in one build.
#pragma once

#include <cstdlib>
#include <cstring>

namespace specdec::cuda {

// `fallback` when the variable is unset; otherwise on unless it is "0". Read by each caller
// once, into a static, at its first use.
inline bool env_switch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::strcmp(v, "0") != 0;
}

// A switch with levels 0..max: `fallback` when the variable is unset, else its value clamped.
inline int env_level(const char* name, int fallback, int max) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  const int level = std::atoi(v);
  return level < 0 ? 0 : level > max ? max : level;
}

}  // namespace specdec::cuda
