// Checked CUDA and cuBLAS(Lt) calls: a failure throws specdec::Error naming the call, the error
// and the context (sizes, tensor names) given by the caller.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace specdec::cuda {

inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(other)";
  }
}

}  // namespace specdec::cuda

// CUDA_CHECK(cudaMemcpyAsync(...), "copy of ", n, " bytes"): throws on failure.
#define SPECDEC_CUDA_CHECK(call, ...)                                                                   \
  do {                                                                                                  \
    const cudaError_t specdec_err_ = (call);                                                            \
    if (specdec_err_ != cudaSuccess)                                                                    \
      ::specdec::fail(#call, " failed: ", cudaGetErrorName(specdec_err_), " (",                        \
                      cudaGetErrorString(specdec_err_), ")" __VA_OPT__(, "; ", ) __VA_ARGS__);          \
  } while (0)

#define SPECDEC_CUBLAS_CHECK(call, ...)                                                                 \
  do {                                                                                                  \
    const cublasStatus_t specdec_st_ = (call);                                                          \
    if (specdec_st_ != CUBLAS_STATUS_SUCCESS)                                                           \
      ::specdec::fail(#call, " failed: ", ::specdec::cuda::cublas_status_name(specdec_st_)             \
                      __VA_OPT__(, "; ", ) __VA_ARGS__);                                                \
  } while (0)
