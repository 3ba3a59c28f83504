// The memory bandwidth a decode step is bound by, measured on this machine: the denominator of
// bench's bandwidth fraction.
#pragma once

#include <cstddef>

#include "backend/backend.h"
#include "specdec/engine.h"

namespace specdec {

// Host reads with `threads` threads (0 = all) for a CPU backend; device-to-device copies on a GPU.
MemoryBandwidth measure_memory_bandwidth(Backend& backend, size_t threads);

}  // namespace specdec
