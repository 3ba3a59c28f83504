// Whether a plain mma.sync kernel that walks K in order (one f32 accumulator per output, the
// k-steps in increasing k) gives the same bits as cuBLASLt's unsplit algorithms: if it does, a
// few-row kernel of that order may serve the batch-invariant mode beside cuBLASLt at larger M.
//
// Variants: m16n8k16 with the weights as A (16 output columns by 8 rows of x), m16n8k16 with x
// as A, and m16n8k8 with the weights as A. Each is compared element by element against
// cuBLASLt's first heuristic candidate set to one split, at several M, for the 8B model's linear
// shapes. Output: mismatching outputs and the largest difference per (shape, M, variant).
// Build and run (GPU host): nvcc -O2 -arch=sm_90a -std=c++17 tools/gpu/mma_bits_probe.cu -lcublasLt
//   -o mma_bits_probe && ./mma_bits_probe
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "probe_check.h"

namespace {

__device__ __forceinline__ uint32_t pair(const __nv_bfloat16* row, int k, int K) {
  // Two consecutive elements (k, k + 1), zero past K (K is even here).
  if (k >= K) return 0;
  return *reinterpret_cast<const uint32_t*>(row + k);
}

__device__ __forceinline__ void mma16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                      uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(b0));
}

// variant 0: W as A (16 columns) x as B (8 rows), k16; 1: x as A (16 rows), W as B (8 columns),
// k16; 2: W as A, x as B, k8. One warp per block, one tile per warp, K in order.
__global__ void mma_linear(const __nv_bfloat16* x, const __nv_bfloat16* w, float* out, int M, int N, int K,
                           int variant) {
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  float d[4] = {0, 0, 0, 0};
  if (variant == 0 || variant == 2) {
    const int n0 = blockIdx.x * 16, m0 = blockIdx.y * 8;
    const int na = n0 + g, nb = n0 + g + 8, m = m0 + g;
    const __nv_bfloat16* wa = w + static_cast<int64_t>(na < N ? na : 0) * K;
    const __nv_bfloat16* wb = w + static_cast<int64_t>(nb < N ? nb : 0) * K;
    const __nv_bfloat16* xr = x + static_cast<int64_t>(m < M ? m : 0) * K;
    const int step = variant == 0 ? 16 : 8;
    for (int k = 0; k < K; k += step) {
      const uint32_t a0 = na < N ? pair(wa, k + 2 * t, K) : 0, a1 = nb < N ? pair(wb, k + 2 * t, K) : 0;
      const uint32_t b0 = m < M ? pair(xr, k + 2 * t, K) : 0;
      if (variant == 0) {
        const uint32_t a2 = na < N ? pair(wa, k + 2 * t + 8, K) : 0, a3 = nb < N ? pair(wb, k + 2 * t + 8, K) : 0;
        const uint32_t b1 = m < M ? pair(xr, k + 2 * t + 8, K) : 0;
        mma16(d, a0, a1, a2, a3, b0, b1);
      } else {
        mma8(d, a0, a1, b0);
      }
    }
    // d0: (column g, row 2t), d1: (g, 2t + 1), d2: (g + 8, 2t), d3: (g + 8, 2t + 1)
    const int cols[4] = {na, na, nb, nb}, rows[4] = {m0 + 2 * t, m0 + 2 * t + 1, m0 + 2 * t, m0 + 2 * t + 1};
    for (int i = 0; i < 4; ++i)
      if (cols[i] < N && rows[i] < M) out[static_cast<int64_t>(rows[i]) * N + cols[i]] = d[i];
  } else {
    const int m0 = blockIdx.y * 16, n0 = blockIdx.x * 8;
    const int ma = m0 + g, mb = m0 + g + 8, n = n0 + g;
    const __nv_bfloat16* xa = x + static_cast<int64_t>(ma < M ? ma : 0) * K;
    const __nv_bfloat16* xb = x + static_cast<int64_t>(mb < M ? mb : 0) * K;
    const __nv_bfloat16* wr = w + static_cast<int64_t>(n < N ? n : 0) * K;
    for (int k = 0; k < K; k += 16) {
      const uint32_t a0 = ma < M ? pair(xa, k + 2 * t, K) : 0, a1 = mb < M ? pair(xb, k + 2 * t, K) : 0;
      const uint32_t a2 = ma < M ? pair(xa, k + 2 * t + 8, K) : 0, a3 = mb < M ? pair(xb, k + 2 * t + 8, K) : 0;
      const uint32_t b0 = n < N ? pair(wr, k + 2 * t, K) : 0, b1 = n < N ? pair(wr, k + 2 * t + 8, K) : 0;
      mma16(d, a0, a1, a2, a3, b0, b1);
    }
    // d0: (row g, column 2t), d1: (g, 2t + 1), d2: (g + 8, 2t), d3: (g + 8, 2t + 1)
    const int rows[4] = {ma, ma, mb, mb}, cols[4] = {n0 + 2 * t, n0 + 2 * t + 1, n0 + 2 * t, n0 + 2 * t + 1};
    for (int i = 0; i < 4; ++i)
      if (cols[i] < N && rows[i] < M) out[static_cast<int64_t>(rows[i]) * N + cols[i]] = d[i];
  }
}

struct Shape {
  const char* name;
  int n, k;
};

void lt_linear(cublasLtHandle_t h, const __nv_bfloat16* x, const __nv_bfloat16* w, float* out, int M, int N, int K,
               void* ws, size_t ws_bytes, int split, bool* ok) {
  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  cublasLtMatrixLayout_t a, b, c;
  CK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, K, N, K));
  CK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, M, K));
  CK(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, N, M, N));
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t wsb = ws_bytes;
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
  cublasLtMatmulHeuristicResult_t res[16];
  int found = 0;
  CK(cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, c, c, pref, 16, res, &found));
  *ok = false;
  for (int i = 0; i < found && !*ok; ++i) {
    cublasLtMatmulAlgo_t algo = res[i].algo;
    const int32_t s = split;
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE, inplace = CUBLASLT_REDUCTION_SCHEME_INPLACE;
    if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &s, sizeof s) != 0) continue;
    if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                             split == 1 ? &none : &inplace, sizeof none) != 0)
      continue;
    cublasLtMatmulHeuristicResult_t chk;
    if (cublasLtMatmulAlgoCheck(h, desc, a, b, c, c, &algo, &chk) != 0) continue;
    const float alpha = 1, beta = 0;
    if (cublasLtMatmul(h, desc, &alpha, w, a, x, b, &beta, out, c, out, c, &algo, ws, ws_bytes, 0) == 0) *ok = true;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(c);
  cublasLtMatmulDescDestroy(desc);
}

}  // namespace

int main() {
  const Shape shapes[] = {{"q/o", 4096, 4096}, {"k/v", 1024, 4096}, {"gate/up", 14336, 4096}, {"down", 4096, 14336}};
  const int Ms[] = {1, 8, 16, 64};
  constexpr int kMaxM = 64;
  cublasLtHandle_t h;
  CK(cublasLtCreate(&h));
  const size_t ws_bytes = size_t(256) << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Shape& s : shapes) {
    std::vector<__nv_bfloat16> hw(size_t(s.n) * s.k), hx(size_t(kMaxM) * s.k);
    for (auto& v : hw) v = __float2bfloat16(nd(rng) * 0.02f);
    for (auto& v : hx) v = __float2bfloat16(nd(rng));
    __nv_bfloat16 *w, *x;
    float *ref, *got;
    CK(cudaMalloc(&w, hw.size() * 2));
    CK(cudaMalloc(&x, hx.size() * 2));
    CK(cudaMalloc(&ref, size_t(kMaxM) * s.n * 4));
    CK(cudaMalloc(&got, size_t(kMaxM) * s.n * 4));
    CK(cudaMemcpy(w, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    for (int M : Ms) {
      std::vector<float> r(size_t(M) * s.n), o(r.size());
      for (int split : {1, 2}) {
        bool ok = false;
        lt_linear(h, x, w, ref, M, s.n, s.k, ws, ws_bytes, split, &ok);
        CK(cudaDeviceSynchronize());
        if (!ok) {
          std::printf("%-8s M=%-3d split %d: no cuBLASLt algorithm\n", s.name, M, split);
          continue;
        }
        CK(cudaMemcpy(r.data(), ref, r.size() * 4, cudaMemcpyDeviceToHost));
        for (int variant = 0; variant < 3; ++variant) {
          const dim3 grid = variant == 1 ? dim3((s.n + 7) / 8, (M + 15) / 16) : dim3((s.n + 15) / 16, (M + 7) / 8);
          mma_linear<<<grid, 32>>>(x, w, got, M, s.n, s.k, variant);
          CK(cudaDeviceSynchronize());
          CK(cudaMemcpy(o.data(), got, o.size() * 4, cudaMemcpyDeviceToHost));
          size_t diff = 0;
          double worst = 0;
          for (size_t i = 0; i < r.size(); ++i) {
            if (std::memcmp(&r[i], &o[i], 4) != 0) ++diff;
            worst = std::fmax(worst, std::fabs(double(r[i]) - o[i]));
          }
          std::printf("%-8s M=%-3d lt split %d vs %s: %zu of %zu outputs differ, max |diff| %.3g\n", s.name, M, split,
                      variant == 0   ? "mma k16 W=A"
                      : variant == 1 ? "mma k16 x=A"
                                     : "mma k8 W=A ",
                      diff, r.size(), worst);
        }
      }
    }
    cudaFree(w);
    cudaFree(x);
    cudaFree(ref);
    cudaFree(got);
  }
  return 0;
}
