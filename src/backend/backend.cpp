// make_backend: picks the device's implementation.
#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#ifdef SPECDEC_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace specdec {

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.device == Device::cpu) return make_cpu_backend(options);
#ifdef SPECDEC_WITH_CUDA
  return make_cuda_backend(options);
#else
  fail("this build of specdec has no CUDA backend (built without the CUDA toolkit)");
#endif
}

bool cuda_available() {
#ifdef SPECDEC_WITH_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

}  // namespace specdec
