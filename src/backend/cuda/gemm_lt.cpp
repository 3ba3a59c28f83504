// cuBLASLt plans and calls for the fast linear path (see gemm_lt.h).
// Layout: cuBLASLt is column-major, so the row-major product out[M,N] = x[M,K]·w[N,K]ᵀ is computed
// as outᵀ (N×M, ld N) = wᵀ-op(A = w as K×N, ld K, transposed) · (B = xᵀ as K×M, ld K).
#include "backend/cuda/gemm_lt.h"

#include "backend/cuda/cuda_check.h"

namespace specdec::cuda {

struct LtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

LtGemm::LtGemm() { SPECDEC_CUBLAS_CHECK(cublasLtCreate(&handle_), "creating the cuBLASLt handle"); }

LtGemm::~LtGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

LtGemm::Plan& LtGemm::plan(const void* x, const void* w, cudaDataType_t type, float* out, int M, int N, int K,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  // `out` here is only where candidates are timed (see run).
  const Key key{M, N, K, static_cast<int>(type)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;

  auto p = std::make_unique<Plan>();
  const auto sizes = str_cat("linear M=", M, " N=", N, " K=", K, " type=", static_cast<int>(type));
  SPECDEC_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), sizes);
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  SPECDEC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)),
                       sizes);
  SPECDEC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)),
                       sizes);
  SPECDEC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, type, K, N, K), sizes, " (layout of w)");
  SPECDEC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, type, K, M, K), sizes, " (layout of x)");
  SPECDEC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, N, M, N), sizes, " (layout of out)");

  cublasLtMatmulPreference_t pref = nullptr;
  SPECDEC_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref), sizes);
  const uint64_t ws = workspace_bytes;
  constexpr int kCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                           sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->c, pref, kCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  SPECDEC_CUBLAS_CHECK(st, "cublasLtMatmulAlgoGetHeuristic for ", sizes);
  SPECDEC_CHECK(found > 0, "cuBLASLt has no algorithm for ", sizes, " with ", workspace_bytes, " bytes of workspace");
  p->algo = results[0].algo;

  // Time the candidates on the real operands (out is overwritten by the call that follows).
  // Not while the stream is being captured into a graph: events cannot be waited on there.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SPECDEC_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture), sizes);
  if (found > 1 && capture == cudaStreamCaptureStatusNone) {
    cudaEvent_t start = nullptr, stop = nullptr;
    SPECDEC_CUDA_CHECK(cudaEventCreate(&start), sizes);
    SPECDEC_CUDA_CHECK(cudaEventCreate(&stop), sizes);
    const float alpha = 1.0f, beta = 0.0f;
    float best = 0.0f;
    bool have = false;
    for (int i = 0; i < found; ++i) {
      float ms = 0.0f;
      bool ok = true;
      for (int rep = 0; rep < 3 && ok; ++rep) {  // the first run warms up; the last one is timed
        ok = cudaEventRecord(start, stream) == cudaSuccess &&
             cublasLtMatmul(handle_, p->desc, &alpha, w, p->a, x, p->b, &beta, out, p->c, out, p->c, &results[i].algo,
                            workspace, workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS &&
             cudaEventRecord(stop, stream) == cudaSuccess && cudaEventSynchronize(stop) == cudaSuccess &&
             cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
      }
      if (ok && (!have || ms < best)) {
        have = true;
        best = ms;
        p->algo = results[i].algo;
      }
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    SPECDEC_CUDA_CHECK(cudaGetLastError(), "timing cuBLASLt candidates for ", sizes);
  }
  return *plans_.emplace(key, std::move(p)).first->second;
}

void LtGemm::run(const void* x, const void* w, cudaDataType_t type, float* out, int M, int N, int K, void* workspace,
                 size_t workspace_bytes, cudaStream_t stream, float beta, float* timing_out) {
  SPECDEC_CHECK(beta == 0.0f || timing_out != nullptr, "linear M=", M, " N=", N, " K=", K,
                ": accumulating into out needs a separate buffer to time candidates on");
  Plan& p = plan(x, w, type, beta == 0.0f ? out : timing_out, M, N, K, workspace, workspace_bytes, stream);
  const float alpha = 1.0f;
  SPECDEC_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c, &p.algo,
                                      workspace, workspace_bytes, stream),
                       "linear M=", M, " N=", N, " K=", K);
}

}  // namespace specdec::cuda
