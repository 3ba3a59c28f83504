// Stream-ordered device memory with a cap (see device_memory.h).
#include "backend/cuda/device_memory.h"

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"

namespace specdec::cuda {

std::shared_ptr<DeviceMemory> DeviceMemory::create(int device, size_t memory_limit) {
  auto m = std::make_shared<DeviceMemory>();
  m->device_ = device;
  SPECDEC_CUDA_CHECK(cudaSetDevice(device), "device ", device);
  SPECDEC_CUDA_CHECK(cudaStreamCreateWithFlags(&m->stream_, cudaStreamNonBlocking), "device ", device);

  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  SPECDEC_CUDA_CHECK(cudaMemPoolCreate(&m->pool_, &props), "device ", device);
  // Keep freed memory in the pool: releasing it to the driver at every synchronization would
  // make each step pay for cudaMalloc again.
  uint64_t threshold = UINT64_MAX;
  SPECDEC_CUDA_CHECK(cudaMemPoolSetAttribute(m->pool_, cudaMemPoolAttrReleaseThreshold, &threshold), "device ",
                     device);

  if (memory_limit > 0) {
    m->cap_ = memory_limit;
  } else {
    size_t free_bytes = 0, total_bytes = 0;
    SPECDEC_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes), "device ", device);
    const size_t reserve = std::min<size_t>(size_t{1} << 30, free_bytes / 10);
    m->cap_ = free_bytes - reserve;
  }
  return m;
}

DeviceMemory::~DeviceMemory() {
  // Destructors must not throw: errors here are ignored (the context may already be torn down).
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (pool_) cudaMemPoolDestroy(pool_);
}

Buffer DeviceMemory::allocate(size_t bytes, const char* what) {
  if (bytes == 0) return Buffer(nullptr, 0, Device::cuda, nullptr);
  // Round to 256 bytes so every allocation suits 16-byte vector loads and the accounting
  // matches what the pool hands out more closely.
  const size_t rounded = (bytes + 255) / 256 * 256;
  size_t used = in_use_.load();
  do {
    SPECDEC_CHECK(used + rounded <= cap_, "cuda memory limit: cannot allocate ", what, " of ", bytes,
                  " bytes: ", used, " bytes already in use and the cap is ", cap_,
                  " bytes (--gpu-memory / BackendOptions::memory_limit; 0 = free device memory at start)");
  } while (!in_use_.compare_exchange_weak(used, used + rounded));

  void* p = nullptr;
  const cudaError_t err = cudaMallocFromPoolAsync(&p, rounded, pool_, stream_);
  if (err != cudaSuccess) {
    in_use_ -= rounded;
    cudaGetLastError();  // clear the sticky-free error state of an out-of-memory
    fail("cudaMallocFromPoolAsync failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), "); allocating ",
         what, " of ", bytes, " bytes with ", used, " bytes in use (cap ", cap_, ")");
  }
  auto self = shared_from_this();
  return Buffer(p, bytes, Device::cuda, [self, rounded](void* q) {
    cudaFreeAsync(q, self->stream_);  // stream-ordered: work already enqueued that reads q finishes first
    self->in_use_ -= rounded;
  });
}

}  // namespace specdec::cuda
