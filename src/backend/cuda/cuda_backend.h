// The CUDA backend (built when the CUDA toolkit is present).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace specdec {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
int cuda_device_count();

// The stream (a cudaStream_t, kept opaque here so this header needs no CUDA headers) on which a
// CUDA backend enqueues all its work: for timing with events and for graph capture.
// Throws specdec::Error when `backend` is not a CUDA backend.
void* cuda_stream_of(const Backend& backend);

}  // namespace specdec
