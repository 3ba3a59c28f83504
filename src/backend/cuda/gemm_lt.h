// cuBLASLt GEMM for the fast (not batch-invariant) linear path at larger M:
// out[M, N] (f32) = x[M, K] · w[N, K]ᵀ (+ out, with beta = 1) with x and w of one type (bf16, f16
// or f32) and f32 accumulation. Plans (descriptors + algorithm) are cached per shape and type; the algorithm is
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

  // beta = 1 adds the product to out in place (a residual add with no second pass). Timing a new
  // shape's candidates overwrites an output, so with beta = 1 they are timed on `timing_out`, an
  // [M, N] f32 buffer whose contents do not matter; with beta = 0, on out itself.
  void run(const void* x, const void* w, cudaDataType_t type, float* out, int M, int N, int K, void* workspace,
           size_t workspace_bytes, cudaStream_t stream, float beta = 0.0f, float* timing_out = nullptr);

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, int>;  // M, N, K, type
  Plan& plan(const void* x, const void* w, cudaDataType_t type, float* timing_out, int M, int N, int K,
             void* workspace, size_t workspace_bytes, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace specdec::cuda
