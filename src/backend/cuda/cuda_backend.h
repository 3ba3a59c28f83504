// The CUDA backend (built when the CUDA toolkit is present).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace specdec {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
int cuda_device_count();

}  // namespace specdec
