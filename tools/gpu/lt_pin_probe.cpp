// Which cuBLASLt algorithms give a row of x the same output bits whatever M is, and which give
// the same bits as each other: what the batch-invariant mode's cuBLASLt path relies on (gemm_lt.h).
//
// For each linear shape of the 8B model: the union of cuBLASLt's heuristic candidates at several
// M, each also with K split 1, 2, 4 and 8 ways. A candidate is invariant when a repeat of a call
// gives the same bits and, at every M of kCheckM and for rows taken from several offsets, each
// row's output equals (bit for bit) the same row computed in one large call. Candidates are then
// grouped by the bits of that large call (classes of equal results), and each is timed at every M
// of kTimeM (ten calls captured in a graph, the median replay). Output: per shape the classes
// with their members and best time per M, the best-scoring candidates, and cuBLASLt's own first
// choice at each M; JSON of the listed rows.
// Build and run (GPU host): g++ -std=c++20 -O2 -I/usr/local/cuda/include tools/gpu/lt_pin_probe.cpp
//   -L/usr/local/cuda/lib64 -lcublasLt -lcudart -o lt_pin_probe && ./lt_pin_probe [JSON_OUT]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "probe_check.h"

namespace {

constexpr int kMaxM = 2048;
const int kCheckM[] = {1, 3, 17, 100};
const int kTimeM[] = {1, 8, 32, 128, 512, 2048};
const int kRefM[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
constexpr size_t kWorkspace = size_t(1) << 30;

struct Shape {
  const char* name;
  int n, k;
};

struct Candidate {
  cublasLtMatmulAlgo_t algo;
  int id = 0, tile = 0, stages = 0, splitk = 1, reduction = 0, swizzle = 0, custom = 0, inner = 0, cluster = 0;
  std::string label() const {
    char b[160];
    std::snprintf(b, sizeof b, "id%d tile%d st%d split%d red%d sw%d cu%d in%d cl%d", id, tile, stages, splitk,
                  reduction, swizzle, custom, inner, cluster);
    return b;
  }
};

template <class T>
T cfg(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof v, &w);
  return v;
}

Candidate describe(const cublasLtMatmulAlgo_t& a) {
  Candidate c;
  c.algo = a;
  c.id = cfg<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID);
  c.tile = int(cfg<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID));
  c.stages = int(cfg<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID));
  c.splitk = cfg<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  c.reduction = int(cfg<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME));
  c.swizzle = int(cfg<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING));
  c.custom = int(cfg<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
  c.inner = int(cfg<uint16_t>(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID));
  c.cluster = int(cfg<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
  return c;
}

struct Op {
  cublasLtMatmulDesc_t desc{};
  cublasLtMatrixLayout_t a{}, b{}, c{};
};

Op make_op(int M, int N, int K) {
  Op o;
  CK(cublasLtMatmulDescCreate(&o.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(o.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CK(cublasLtMatmulDescSetAttribute(o.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CK(cublasLtMatrixLayoutCreate(&o.a, CUDA_R_16BF, K, N, K));
  CK(cublasLtMatrixLayoutCreate(&o.b, CUDA_R_16BF, K, M, K));
  CK(cublasLtMatrixLayoutCreate(&o.c, CUDA_R_32F, N, M, N));
  return o;
}

void free_op(Op& o) {
  cublasLtMatrixLayoutDestroy(o.a);
  cublasLtMatrixLayoutDestroy(o.b);
  cublasLtMatrixLayoutDestroy(o.c);
  cublasLtMatmulDescDestroy(o.desc);
}

struct Ctx {
  cublasLtHandle_t lt{};
  cudaStream_t s{};
  void* ws{};
  __nv_bfloat16 *x{}, *w{};
  float *out{}, *ref{};
};

bool run(Ctx& c, const Candidate& cand, int M, int N, int K, int row0, float* out, float beta = 0.0f) {
  Op o = make_op(M, N, K);
  cublasLtMatmulHeuristicResult_t check{};
  bool ok = cublasLtMatmulAlgoCheck(c.lt, o.desc, o.a, o.b, o.c, o.c, &cand.algo, &check) == CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= kWorkspace;
  const float alpha = 1.0f;
  if (ok)
    ok = cublasLtMatmul(c.lt, o.desc, &alpha, c.w, o.a, c.x + size_t(row0) * K, o.b, &beta, out, o.c, out, o.c,
                        &cand.algo, c.ws, kWorkspace, c.s) == CUBLAS_STATUS_SUCCESS;
  free_op(o);
  return ok;
}


// GPU time of one call: 20 calls captured in a graph, replayed 5 times, the median replay / 20.
double time_graph(Ctx& c, const Candidate& cand, int M, int N, int K, cudaEvent_t e0, cudaEvent_t e1) {
  Op o = make_op(M, N, K);
  cublasLtMatmulHeuristicResult_t check{};
  if (cublasLtMatmulAlgoCheck(c.lt, o.desc, o.a, o.b, o.c, o.c, &cand.algo, &check) != CUBLAS_STATUS_SUCCESS ||
      check.workspaceSize > kWorkspace) {
    free_op(o);
    return 1e9;
  }
  const float alpha = 1.0f, beta = 0.0f;
  cudaGraph_t g{};
  cudaGraphExec_t ge{};
  CK(cudaStreamBeginCapture(c.s, cudaStreamCaptureModeThreadLocal));
  bool ok = true;
  for (int i = 0; i < 10; ++i)
    ok = ok && cublasLtMatmul(c.lt, o.desc, &alpha, c.w, o.a, c.x, o.b, &beta, c.out, o.c, c.out, o.c, &cand.algo,
                              c.ws, kWorkspace, c.s) == CUBLAS_STATUS_SUCCESS;
  CK(cudaStreamEndCapture(c.s, &g));
  free_op(o);
  if (!ok || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(g);
    return 1e9;
  }
  std::vector<float> t;
  for (int rep = 0; rep < 4; ++rep) {
    CK(cudaEventRecord(e0, c.s));
    CK(cudaGraphLaunch(ge, c.s));
    CK(cudaEventRecord(e1, c.s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep) t.push_back(ms / 10);
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<std::pair<int, std::string>> g_top1;
std::vector<Candidate> candidates(Ctx& c, int N, int K) {
  std::vector<Candidate> all;
  g_top1.clear();
  auto add = [&](const cublasLtMatmulAlgo_t& a) {
    for (auto& e : all)
      if (std::memcmp(&e.algo, &a, sizeof a) == 0) return;
    all.push_back(describe(a));
  };
  for (int M : kRefM) {
    Op o = make_op(M, N, K);
    cublasLtMatmulPreference_t pref{};
    CK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspace;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t res[32] = {};
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(c.lt, o.desc, o.a, o.b, o.c, o.c, pref, 32, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    free_op(o);
    if (found > 0) g_top1.emplace_back(M, describe(res[0].algo).label());
    for (int i = 0; i < found; ++i) {
      add(res[i].algo);
      // The same kernel with K split a fixed number of ways (reduction as the library prefers).
      for (int32_t split : {1, 2, 4, 8}) {
        cublasLtMatmulAlgo_t a = res[i].algo;
        if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split) !=
            CUBLAS_STATUS_SUCCESS)
          continue;
        uint32_t red = split == 1 ? CUBLASLT_REDUCTION_SCHEME_NONE : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        if (describe(res[i].algo).splitk > 1 && split > 1) red = uint32_t(describe(res[i].algo).reduction);
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red);
        add(a);
      }
    }
  }
  return all;
}

bool same_rows(const std::vector<float>& got, const std::vector<float>& ref, int rows, int ref_row0, int N) {
  return std::memcmp(got.data(), ref.data() + size_t(ref_row0) * N, sizeof(float) * size_t(rows) * N) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = argc > 1 ? argv[1] : nullptr;
  const Shape shapes[] = {{"q/o 4096x4096", 4096, 4096},
                          {"k/v 1024x4096", 1024, 4096},
                          {"gate/up 14336x4096", 14336, 4096},
                          {"down 4096x14336", 4096, 14336},
                          {"lm_head 128256x4096", 128256, 4096}};
  Ctx c;
  CK(cublasLtCreate(&c.lt));
  CK(cudaStreamCreate(&c.s));
  CK(cudaMalloc(&c.ws, kWorkspace));
  const int maxN = 128256, maxK = 14336;
  CK(cudaMalloc(&c.x, sizeof(__nv_bfloat16) * size_t(kMaxM) * maxK));
  CK(cudaMalloc(&c.w, sizeof(__nv_bfloat16) * size_t(maxN) * maxK / 3));  // lm_head N*K is the largest product
  CK(cudaMalloc(&c.out, sizeof(float) * size_t(kMaxM) * maxN));
  {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<__nv_bfloat16> h(size_t(kMaxM) * maxK);
    for (auto& v : h) v = __float2bfloat16(d(rng));
    CK(cudaMemcpy(c.x, h.data(), sizeof(__nv_bfloat16) * h.size(), cudaMemcpyHostToDevice));
    // Weights: a random 32 Mi-value block repeated (the columns of a row still differ).
    const size_t block = size_t(1) << 25, total = size_t(maxN) * maxK / 3;
    std::vector<__nv_bfloat16> hw(block + 7);
    for (auto& v : hw) v = __float2bfloat16(d(rng) * 0.05f);
    for (size_t at = 0, i = 0; at < total; at += block, ++i)
      CK(cudaMemcpy(c.w + at, hw.data() + i % 7, sizeof(__nv_bfloat16) * std::min(block, total - at),
                    cudaMemcpyHostToDevice));
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  std::string json = "[";
  for (const Shape& sh : shapes) {
    const int N = sh.n, K = sh.k;
    const int refM = N >= 100000 ? 256 : kMaxM;  // lm_head: the logits of 256 rows are enough
    auto cands = candidates(c, N, K);
    std::printf("\n## %s: %zu candidates\n", sh.name, cands.size());
    std::vector<float> ref(size_t(refM) * N), got;
    std::vector<double> best(std::size(kTimeM), 1e30);
    struct Row {
      Candidate cand;
      bool invariant;
      std::vector<double> ms;
      uint64_t hash = 0;
    };
    std::vector<Row> rows;
    for (const Candidate& cand : cands) {
      Row r{cand, true, {}};
      if (!run(c, cand, refM, N, K, 0, c.out) || cudaStreamSynchronize(c.s) != cudaSuccess) {
        cudaGetLastError();
        continue;
      }
      CK(cudaMemcpy(ref.data(), c.out, sizeof(float) * ref.size(), cudaMemcpyDeviceToHost));
      {
        uint64_t h = 1469598103934665603ull;
        const unsigned char* b = reinterpret_cast<const unsigned char*>(ref.data());
        for (size_t i = 0; i < ref.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
        r.hash = h;
      }
      // Repeat: the same call must give the same bits.
      if (run(c, cand, refM, N, K, 0, c.out)) {
        got.resize(ref.size());
        CK(cudaMemcpy(got.data(), c.out, sizeof(float) * got.size(), cudaMemcpyDeviceToHost));
        if (!same_rows(got, ref, refM, 0, N)) r.invariant = false;
      }
      for (int M : kCheckM) {
        if (M >= refM || !r.invariant) continue;
        for (int row0 : {0, (refM - M) / 2, refM - M}) {
          if (!run(c, cand, M, N, K, row0, c.out)) {
            r.invariant = false;
            break;
          }
          got.resize(size_t(M) * N);
          CK(cudaMemcpy(got.data(), c.out, sizeof(float) * got.size(), cudaMemcpyDeviceToHost));
          if (!same_rows(got, ref, M, row0, N)) {
            r.invariant = false;
            break;
          }
        }
      }
      for (size_t i = 0; i < std::size(kTimeM); ++i) {
        const int M = std::min(kTimeM[i], N >= 100000 ? 256 : kMaxM);
        r.ms.push_back(time_graph(c, cand, M, N, K, e0, e1));
        best[i] = std::min(best[i], r.ms.back());
      }
      rows.push_back(r);
    }
    // Score: geometric mean over M of time / best time at that M.
    auto score = [&](const Row& r) {
      double s = 0;
      for (size_t i = 0; i < r.ms.size(); ++i) s += std::log(r.ms[i] / best[i]);
      return std::exp(s / r.ms.size());
    };
    std::sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
      if (a.invariant != b.invariant) return a.invariant;
      return score(a) < score(b);
    });
    {
      std::vector<uint64_t> hs;
      for (const Row& r : rows)
        if (std::find(hs.begin(), hs.end(), r.hash) == hs.end()) hs.push_back(r.hash);
      std::printf("%zu classes of equal bits among %zu candidates\n", hs.size(), rows.size());
      for (uint64_t h : hs) {
        std::vector<double> cb(std::size(kTimeM), 1e30);
        int n = 0;
        std::string members;
        for (const Row& r : rows)
          if (r.hash == h) {
            ++n;
            for (size_t i = 0; i < cb.size(); ++i) cb[i] = std::min(cb[i], r.ms[i]);
            if (n <= 40) members += " [" + r.cand.label() + "]";
          }
        std::printf("class %016llx: %d members; best ms per M:", static_cast<unsigned long long>(h), n);
        for (double m : cb) std::printf(" %.4f", m);
        std::printf("\n   members:%s\n", members.c_str());
      }
    }
    std::printf("| candidate | invariant | score |");
    for (int M : kTimeM) std::printf(" M=%d ms |", M);
    std::printf("\n| best of all | | |");
    for (double b : best) std::printf(" %.4f |", b);
    std::printf("\n");
    int shown_var = 0;
    for (const Row& r : rows) {
      if (++shown_var > 4) break;
      std::printf("| %s | %s | %.3f |", r.cand.label().c_str(), r.invariant ? "yes" : "NO", score(r));
      for (double m : r.ms) std::printf(" %.4f |", m);
      std::printf("\n");
      char b[512];
      std::snprintf(b, sizeof b, "%s{\"shape\":\"%s\",\"candidate\":\"%s\",\"invariant\":%s,\"score\":%.4f,\"ms\":[",
                    json.size() > 1 ? "," : "", sh.name, r.cand.label().c_str(), r.invariant ? "true" : "false",
                    score(r));
      json += b;
      for (size_t i = 0; i < r.ms.size(); ++i) json += (i ? "," : "") + std::to_string(r.ms[i]);
      json += "]}";
    }
    for (auto& [refm, label] : g_top1)
      for (const Row& r : rows)
        if (r.cand.label() == label) {
          std::printf("| heuristic top-1 at M=%d: %s | %s | %.3f |", refm, label.c_str(), r.invariant ? "yes" : "NO",
                      score(r));
          for (double m : r.ms) std::printf(" %.4f |", m);
          std::printf("\n");
        }
    std::fflush(stdout);
  }
  json += "]\n";
  if (json_path) {
    FILE* f = std::fopen(json_path, "w");
    if (f) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  }
  return 0;
}
