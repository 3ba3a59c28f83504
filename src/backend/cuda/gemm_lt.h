// cuBLASLt GEMM for the linears of 16-bit weights (both modes) and f32 weights at larger M (fast
// mode): out[M, N] = x[M, K] · w[N, K]ᵀ (+ out, with beta = 1) with x and w of one type (bf16, f16
// or f32), f32 accumulation, and out in f32 or (the fast mode's wide intermediates) rounded to
// x's 16-bit type. Plans (descriptors + algorithm) are cached per shape
// and type; the algorithm is the fastest of cuBLASLt's heuristic candidates, timed once on the
// first call of a shape.
//
// whole_k: only algorithms that do not split K, and of the algorithm id that the first plan of the
// same (N, K, type) chose. Each output is then one accumulator over K in order, whatever the tile,
// cluster or M: across every candidate cuBLASLt offers for the linears of an 8B model on Hopper,
// the algorithms of one split count gave the same bits for a row at every M
// (tools/gpu/lt_pin_probe.cpp; the GPU tests check it for the shapes they run). So the
// batch-invariant mode may still pick the fastest unsplit algorithm per M.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace specdec::cuda {

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // out_type: CUDA_R_32F, or `type` where that is 16-bit. beta = 1 adds the product to out in place
  // (a residual add with no second pass). Timing a new shape's candidates overwrites an output, so
  // with beta = 1 they are timed on `timing_out`, an [M, N] buffer of out_type whose contents do
  // not matter; with beta = 0, on out itself.
  void run(const void* x, const void* w, cudaDataType_t type, void* out, cudaDataType_t out_type, int M, int N, int K,
           void* workspace, size_t workspace_bytes, cudaStream_t stream, bool whole_k, float beta = 0.0f,
           void* timing_out = nullptr);

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, int, int, bool>;  // M, N, K, type, out type, whole_k
  Plan& plan(const void* x, const void* w, cudaDataType_t type, void* timing_out, cudaDataType_t out_type, int M, int N,
             int K, void* workspace, size_t workspace_bytes, cudaStream_t stream, bool whole_k);

  using PinKey = std::tuple<int, int, int, int>;  // N, K, type, out type
  std::vector<cublasLtMatmulAlgo_t> whole_k_candidates(const cublasLtMatmulHeuristicResult_t* results, int found,
                                                       const Plan& p, const PinKey& pin, const std::string& sizes);

  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<PinKey, cublasLtMatmulAlgo_t> pinned_;  // whole_k: the first plan's algorithm per (N, K, type)
};

}  // namespace specdec::cuda
