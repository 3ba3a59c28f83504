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

namespace {

int32_t split_count(const cublasLtMatmulAlgo_t& algo) {
  int32_t split = 1;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split, &written) !=
      CUBLAS_STATUS_SUCCESS)
    return -1;  // unknown: not kept where K must stay whole
  return split;
}

}  // namespace

// Keeps, in order, the candidates that do not split K; with none, the first candidate set to one
// split (if cuBLASLt accepts it for this shape). Returns how many are left in results.
int LtGemm::keep_whole_k(cublasLtMatmulHeuristicResult_t* results, int found, cublasLtMatmulDesc_t desc,
                         cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                         const std::string& sizes) {
  int kept = 0;
  for (int i = 0; i < found; ++i)
    if (split_count(results[i].algo) <= 1 && split_count(results[i].algo) >= 0) results[kept++] = results[i];
  if (kept > 0) return kept;
  cublasLtMatmulAlgo_t algo = results[0].algo;
  const int32_t one = 1;
  const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
  cublasLtMatmulHeuristicResult_t checked{};
  const bool ok =
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulAlgoCheck(handle_, desc, a, b, c, c, &algo, &checked) == CUBLAS_STATUS_SUCCESS;
  SPECDEC_CHECK(ok, "cuBLASLt offers no algorithm for ", sizes, " that keeps K in one pass (batch-invariant mode)");
  results[0] = checked;
  results[0].algo = algo;
  return 1;
}

LtGemm::LtGemm() { SPECDEC_CUBLAS_CHECK(cublasLtCreate(&handle_), "creating the cuBLASLt handle"); }

LtGemm::~LtGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

LtGemm::Plan& LtGemm::plan(const void* x, const void* w, cudaDataType_t type, float* out, int M, int N, int K,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream, bool whole_k) {
  // `out` here is only where candidates are timed (see run).
  const Key key{M, N, K, static_cast<int>(type), whole_k};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;

  auto p = std::make_unique<Plan>();
  const auto sizes =
      str_cat("linear M=", M, " N=", N, " K=", K, " type=", static_cast<int>(type), whole_k ? " (K unsplit)" : "");
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
  constexpr int kCandidates = 16;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                           sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->c, pref, kCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  SPECDEC_CUBLAS_CHECK(st, "cublasLtMatmulAlgoGetHeuristic for ", sizes);
  SPECDEC_CHECK(found > 0, "cuBLASLt has no algorithm for ", sizes, " with ", workspace_bytes, " bytes of workspace");
  if (whole_k) found = keep_whole_k(results, found, p->desc, p->a, p->b, p->c, sizes);
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
                 size_t workspace_bytes, cudaStream_t stream, bool whole_k, float beta, float* timing_out) {
  SPECDEC_CHECK(beta == 0.0f || timing_out != nullptr, "linear M=", M, " N=", N, " K=", K,
                ": accumulating into out needs a separate buffer to time candidates on");
  Plan& p = plan(x, w, type, beta == 0.0f ? out : timing_out, M, N, K, workspace, workspace_bytes, stream, whole_k);
  const float alpha = 1.0f;
  SPECDEC_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c, &p.algo,
                                      workspace, workspace_bytes, stream),
                       "linear M=", M, " N=", N, " K=", K);
}

}  // namespace specdec::cuda
