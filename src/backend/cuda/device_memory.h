// The device side of one CUDA backend: its stream and a stream-ordered memory pool with a cap.
// Buffers hold a shared_ptr to this state, so memory is freed (stream-ordered) correctly even
// when a Buffer outlives the Backend that made it.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace specdec::cuda {

class DeviceMemory : public std::enable_shared_from_this<DeviceMemory> {
 public:
  // memory_limit 0: the cap is the free device memory now, less a reserve for the CUDA
  // context, cuBLASLt and other processes (1 GiB or 10 %, whichever is smaller).
  static std::shared_ptr<DeviceMemory> create(int device, size_t memory_limit);
  DeviceMemory() = default;  // use create()
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // Stream-ordered allocation from the pool; throws naming the request and the cap when the cap
  // would be passed. `what` names the allocation in errors.
  Buffer allocate(size_t bytes, const char* what = "buffer");

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  size_t cap() const { return cap_; }
  size_t in_use() const { return in_use_.load(); }

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  size_t cap_ = 0;
  std::atomic<size_t> in_use_{0};
};

}  // namespace specdec::cuda
