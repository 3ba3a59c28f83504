// cuBLASLt GEMM for the fast (not batch-invariant) linear path at larger M:
// out[M, N] (f32) = x[M, K] · w[N, K]ᵀ with x and w of one type (bf16, f16 or f32) and f32
// accumulation. Plans (descriptors + algorithm) are cached per shape and type; the algorithm is
// the fastest of cuBLASLt's heuristic candidates, timed once on the first call of a shape.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>
#include <tuple>

namespace specdec::cuda {

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  void run(const void* x, const void* w, cudaDataType_t type, float* out, int M, int N, int K, void* workspace,
           size_t workspace_bytes, cudaStream_t stream);

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, int>;  // M, N, K, type
  Plan& plan(const void* x, const void* w, cudaDataType_t type, float* out, int M, int N, int K, void* workspace,
             size_t workspace_bytes, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace specdec::cuda
