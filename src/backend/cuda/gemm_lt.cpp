// cuBLASLt plans and calls for the fast linear path (see gemm_lt.h).
// Layout: cuBLASLt is column-major, so the row-major product out[M,N] = x[M,K]·w[N,K]ᵀ is computed
// as outᵀ (N×M, ld N) = wᵀ-op(A = w as K×N, ld K, transposed) · (B = xᵀ as K×M, ld K).
#include "backend/cuda/gemm_lt.h"

#include "backend/cuda/cuda_check.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

template <typename T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr, T fallback) {
  T value = fallback;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof value, &written) != CUBLAS_STATUS_SUCCESS)
    return fallback;
  return value;
}

bool same_algo(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Holds a stream (a host function spinning until `open`) while work is enqueued behind it.
struct StreamGate {
  std::atomic<bool> open{false};
  static void CUDART_CB wait(void* self) {
    const auto* gate = static_cast<const StreamGate*>(self);
    while (!gate->open.load(std::memory_order_acquire)) {
    }
  }
};

// SPECDEC_CUDA_LT_LOG=1 prints each plan's choice to stderr (which algorithm the timing kept).
bool log_plans() {
  static const bool on = [] {
    const char* v = std::getenv("SPECDEC_CUDA_LT_LOG");
    return v != nullptr && std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace

// Candidates that keep K in one pass: each heuristic result as it is when unsplit, else set to one
// split (cuBLASLt's best tiles for a few rows are often split ones), if cuBLASLt accepts that for
// this shape. Only algorithms of the id the first plan of this (N, K, type) chose: across ids the
// bits were not measured to agree. With none left, that first plan's algorithm itself.
std::vector<cublasLtMatmulAlgo_t> LtGemm::whole_k_candidates(const cublasLtMatmulHeuristicResult_t* results,
                                                             int found, const Plan& p, const PinKey& pin,
                                                             const std::string& sizes) {
  const auto pinned = pinned_.find(pin);
  std::vector<cublasLtMatmulAlgo_t> out;
  auto accept = [&](cublasLtMatmulAlgo_t algo) {
    if (pinned != pinned_.end() && algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID, -1) !=
                                       algo_config<int32_t>(pinned->second, CUBLASLT_ALGO_CONFIG_ID, -2))
      return;
    if (algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1) != 1) {
      const int32_t one = 1;
      const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none) !=
              CUBLAS_STATUS_SUCCESS)
        return;
    }
    cublasLtMatmulHeuristicResult_t checked{};
    if (cublasLtMatmulAlgoCheck(handle_, p.desc, p.a, p.b, p.c, p.c, &algo, &checked) != CUBLAS_STATUS_SUCCESS)
      return;
    for (const auto& have : out)
      if (same_algo(have, algo)) return;
    out.push_back(algo);
  };
  for (int i = 0; i < found; ++i) accept(results[i].algo);
  if (out.empty() && pinned != pinned_.end()) {
    cublasLtMatmulHeuristicResult_t checked{};
    if (cublasLtMatmulAlgoCheck(handle_, p.desc, p.a, p.b, p.c, p.c, &pinned->second, &checked) ==
        CUBLAS_STATUS_SUCCESS)
      out.push_back(pinned->second);
  }
  SPECDEC_CHECK(!out.empty(), "cuBLASLt offers no algorithm for ", sizes,
                " that keeps K in one pass with the algorithm of this shape's other plans (batch-invariant mode)");
  return out;
}

LtGemm::LtGemm() { SPECDEC_CUBLAS_CHECK(cublasLtCreate(&handle_), "creating the cuBLASLt handle"); }

LtGemm::~LtGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

LtGemm::Plan& LtGemm::plan(const void* x, const void* w, cudaDataType_t type, void* out, cudaDataType_t out_type, int M,
                           int N, int K, void* workspace, size_t workspace_bytes, cudaStream_t stream, bool whole_k) {
  // `out` here is only where candidates are timed (see run).
  const Key key{M, N, K, static_cast<int>(type), static_cast<int>(out_type), whole_k};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;

  auto p = std::make_unique<Plan>();
  const auto sizes = str_cat("linear M=", M, " N=", N, " K=", K, " type=", static_cast<int>(type),
                             " out=", static_cast<int>(out_type), whole_k ? " (K unsplit)" : "");
  SPECDEC_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), sizes);
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  SPECDEC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)),
                       sizes);
  SPECDEC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)),
                       sizes);
  SPECDEC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, type, K, N, K), sizes, " (layout of w)");
  SPECDEC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, type, K, M, K), sizes, " (layout of x)");
  SPECDEC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, out_type, N, M, N), sizes, " (layout of out)");

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
  const PinKey pin{N, K, static_cast<int>(type), static_cast<int>(out_type)};
  std::vector<cublasLtMatmulAlgo_t> candidates;
  if (whole_k) {
    candidates = whole_k_candidates(results, found, *p, pin, sizes);
  } else {
    for (int i = 0; i < found; ++i) candidates.push_back(results[i].algo);
  }
  p->algo = candidates[0];
  float best = -1.0f;

  // Time the candidates on the real operands (out is overwritten by the call that follows).
  // Not while the stream is being captured into a graph: events cannot be waited on there.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SPECDEC_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture), sizes);
  if (candidates.size() > 1 && capture == cudaStreamCaptureStatusNone) {
    cudaEvent_t start = nullptr, stop = nullptr;
    SPECDEC_CUDA_CHECK(cudaEventCreate(&start), sizes);
    SPECDEC_CUDA_CHECK(cudaEventCreate(&stop), sizes);
    const float alpha = 1.0f, beta = 0.0f;
    bool have = false;
    for (size_t i = 0; i < candidates.size(); ++i) {
      float ms = 0.0f;
      bool ok = true;
      // One call warms up; then the stream is held while kTimed calls are enqueued, so that they
      // run back to back and the events time the GPU: a few-row GEMM takes about as long as
      // launching one, so timing calls as they are launched would rank candidates by launch noise.
      constexpr int kTimed = 4;
      auto call = [&] {
        return cublasLtMatmul(handle_, p->desc, &alpha, w, p->a, x, p->b, &beta, out, p->c, out, p->c, &candidates[i],
                              workspace, workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
      };
      StreamGate gate;
      ok = call() && cudaLaunchHostFunc(stream, StreamGate::wait, &gate) == cudaSuccess &&
           cudaEventRecord(start, stream) == cudaSuccess;
      for (int rep = 0; rep < kTimed && ok; ++rep) ok = call();
      ok = ok && cudaEventRecord(stop, stream) == cudaSuccess;
      gate.open.store(true, std::memory_order_release);
      ok = cudaStreamSynchronize(stream) == cudaSuccess && ok && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
      ms /= kTimed;
      if (ok && (!have || ms < best)) {
        have = true;
        best = ms;
        p->algo = candidates[i];
      }
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    SPECDEC_CUDA_CHECK(cudaGetLastError(), "timing cuBLASLt candidates for ", sizes);
  }
  if (whole_k) pinned_.emplace(pin, p->algo);
  if (log_plans())
    std::fprintf(stderr, "cuBLASLt plan %s: %zu candidates, kept id %d tile %u stages %u split %d (%.4f ms)\n",
                 sizes.c_str(), candidates.size(), algo_config<int32_t>(p->algo, CUBLASLT_ALGO_CONFIG_ID, -1),
                 algo_config<uint32_t>(p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, 0),
                 algo_config<uint32_t>(p->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, 0),
                 algo_config<int32_t>(p->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1), static_cast<double>(best));
  return *plans_.emplace(key, std::move(p)).first->second;
}

void LtGemm::run(const void* x, const void* w, cudaDataType_t type, void* out, cudaDataType_t out_type, int M, int N,
                 int K, void* workspace, size_t workspace_bytes, cudaStream_t stream, bool whole_k, float beta,
                 void* timing_out) {
  SPECDEC_CHECK(beta == 0.0f || timing_out != nullptr, "linear M=", M, " N=", N, " K=", K,
                ": accumulating into out needs a separate buffer to time candidates on");
  Plan& p =
      plan(x, w, type, beta == 0.0f ? out : timing_out, out_type, M, N, K, workspace, workspace_bytes, stream, whole_k);
  const float alpha = 1.0f;
  SPECDEC_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c, &p.algo,
                                      workspace, workspace_bytes, stream),
                       "linear M=", M, " N=", N, " K=", K);
}

}  // namespace specdec::cuda
