// The CPU backend: AVX-512, AVX2 or portable kernels chosen at run time, multi-threaded.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace specdec {

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);

}  // namespace specdec
