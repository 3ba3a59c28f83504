// The CUDA linear in both modes vs the scalar CPU backend on the same 16-bit weights, and batch
// invariance of the batch-invariant mode: a row's output is bit-identical at M = 1, 8 and 33.
// Where the batch-invariant mode takes the tensor-core linear (16-bit weights, K a multiple of
// 8), x is rounded to the weights' type for the products: the CPU reference gets x so rounded.
#include <array>
#include <cstdlib>

#include "backend/cuda/kernels.h"
#include "gpu/gpu_test_util.h"

namespace specdec::gpu_test {
namespace {

struct LinearCase {
  int M, N, K;
  DType wt;
  bool bias;
};

std::vector<float> run_linear(Backend& be, const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>* bias, const LinearCase& c) {
  Owned xt = upload(be, x, DType::f32, {c.M, c.K});
  Owned wtn = upload(be, w, c.wt, {c.N, c.K});
  Owned o = empty(be, DType::f32, {c.M, c.N});
  if (bias) {
    Owned bt = upload(be, *bias, DType::f32, {c.N});
    be.linear(xt.tensor, Weight(wtn.tensor), &bt.tensor, o.tensor);
    return download(be, o.tensor);
  }
  be.linear(xt.tensor, Weight(wtn.tensor), nullptr, o.tensor);
  return download(be, o.tensor);
}

// cpu_rounds_x: the CPU reference takes x rounded to the weights' type.
double compare_with_cpu(Backends& b, const LinearCase& c, uint32_t seed, bool cpu_rounds_x = false) {
  const auto x = random_floats(static_cast<size_t>(c.M) * c.K, seed);
  const auto w = random_floats(static_cast<size_t>(c.N) * c.K, seed + 1);
  const auto bias = random_floats(static_cast<size_t>(c.N), seed + 2);
  const auto* bp = c.bias ? &bias : nullptr;
  return rel_error(run_linear(*b.gpu, x, w, bp, c), run_linear(*b.cpu, cpu_rounds_x ? rounded(x, c.wt) : x, w, bp, c));
}

// Tensor-core linears (cuBLASLt or gemm.cu) against the CPU on the same rounded operands: the
// MMA's f32 sums of each k-step do not round like a chain of fma, a few 2^-24 more per step.
constexpr double kMmaTol = 5e-5;

std::string describe(const LinearCase& c) {
  return str_cat("M=", c.M, " N=", c.N, " K=", c.K, " ", dtype_name(c.wt), c.bias ? " +bias" : "");
}

TEST(GpuLinear, InvariantModeMatchesCpu) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends(true);
  const std::vector<LinearCase> cases = {
      {1, 64, 64, DType::bf16, false},    {3, 200, 4096, DType::bf16, true}, {8, 96, 1000, DType::bf16, false},
      {33, 40, 2056, DType::bf16, false}, {5, 50, 100, DType::bf16, true},   {2, 64, 37, DType::bf16, false},
      {17, 64, 512, DType::f16, true},    {4, 48, 300, DType::f32, false},   {9, 31, 14336, DType::bf16, false},
      {130, 64, 256, DType::bf16, false}, {2, 256, 4096, DType::bf16, true}, {2, 300, 1024, DType::f16, false},
      {1, 300, 14336, DType::bf16, true}, {2, 72, 512, DType::f32, true},
  };
  uint32_t seed = 100;
  for (const auto& c : cases) {
    const bool rounds_x = invariant_rounds_x(c.wt, c.K, c.N);
    EXPECT_LE(compare_with_cpu(b, c, seed += 3, rounds_x), rounds_x ? kMmaTol : 1e-5) << describe(c);
  }
}

TEST(GpuLinear, FastModeMatchesCpu) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends(false);
  // M <= 2 uses the f32-activation kernel; larger M rounds x to bf16 for cuBLASLt, which costs
  // about 2^-9 relative per product: bounded here by 1e-2 of the output scale.
  const std::vector<std::pair<LinearCase, double>> cases = {
      {{1, 256, 4096, DType::bf16, false}, 1e-5}, {{2, 256, 1024, DType::bf16, true}, 1e-5},
      {{3, 256, 1024, DType::bf16, false}, 1e-2}, {{8, 256, 1024, DType::bf16, true}, 1e-2},
      {{64, 512, 4096, DType::bf16, true}, 1e-2}, {{100, 64, 200, DType::f16, false}, 1e-2},
      {{40, 64, 128, DType::f32, false}, 1e-5},
  };
  uint32_t seed = 200;
  for (const auto& [c, tol] : cases) EXPECT_LE(compare_with_cpu(b, c, seed += 3), tol) << describe(c);
}

std::unique_ptr<Backend> fast_gpu(int skinny_max_m) {
  CudaTuning t;
  t.skinny_max_m = skinny_max_m;
  return make_gpu(t, /*batch_invariant=*/false);
}

// The fast mode's skinny kernel (3 to kSkinnyMaxM rows of 16-bit weights) against the CPU on the
// same rounded x: both row tilings it has (up to 8 and 16 rows), column counts that leave part of
// a 16-column tile, K of 1 to hundreds of 32-wide chunks (fewer chunks than the block's warps
// included), the residual add, and the same calls on cuBLASLt for comparison.
TEST(GpuLinear, FastModeSkinnyKernelMatchesCpu) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends(false);
  b.gpu = fast_gpu(cuda::kSkinnyMaxM);
  const auto lt = fast_gpu(0);
  const std::vector<LinearCase> cases = {
      {3, 200, 4096, DType::bf16, true},  {8, 96, 1024, DType::bf16, false}, {5, 50, 96, DType::bf16, false},
      {9, 31, 14336, DType::bf16, false}, {16, 512, 32, DType::f16, true},   {12, 40, 2048, DType::bf16, false},
      {7, 264, 512, DType::f16, false},
  };
  uint32_t seed = 300;
  for (const auto& c : cases) {
    const auto x = random_floats(static_cast<size_t>(c.M) * c.K, seed += 3);
    const auto w = random_floats(static_cast<size_t>(c.N) * c.K, seed + 1);
    const auto bias = random_floats(static_cast<size_t>(c.N), seed + 2);
    const auto* bp = c.bias ? &bias : nullptr;
    const auto want = run_linear(*b.cpu, rounded(x, c.wt), w, bp, c);
    const uint64_t before = cuda::skinny_gemm_launches();
    EXPECT_LE(rel_error(run_linear(*b.gpu, x, w, bp, c), want), kMmaTol) << describe(c);
    EXPECT_EQ(cuda::skinny_gemm_launches(), before + 1) << describe(c) << ": not served by the skinny kernel";
    EXPECT_LE(rel_error(run_linear(*lt, x, w, bp, c), want), kMmaTol) << describe(c) << " (cuBLASLt)";
    EXPECT_EQ(cuda::skinny_gemm_launches(), before + 1) << describe(c) << ": skinny_max_m = 0 still took it";

    // The residual add: out = r + x · wᵀ inside the product.
    const auto r = random_floats(static_cast<size_t>(c.M) * c.N, seed + 5);
    std::vector<float> sums[2];
    Backend* backends[2] = {b.cpu.get(), b.gpu.get()};
    for (int i = 0; i < 2; ++i) {
      Backend& be = *backends[i];
      Owned xt = upload(be, i == 0 ? rounded(x, c.wt) : x, DType::f32, {c.M, c.K});
      Owned wt = upload(be, w, c.wt, {c.N, c.K});
      Owned out = upload(be, r, DType::f32, {c.M, c.N});
      be.linear_add(xt.tensor, Weight(wt.tensor), nullptr, out.tensor);
      sums[i] = download(be, out.tensor);
    }
    EXPECT_LE(rel_error(sums[1], sums[0]), kMmaTol) << describe(c) << " (residual add)";
  }
}

TEST(GpuLinear, InvariantModeIsBatchInvariant) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends(true);
  for (int K : {4096, 1000, 37}) {
    const int N = 72, maxM = 33;
    const auto x = random_floats(static_cast<size_t>(maxM) * K, 300 + static_cast<uint32_t>(K));
    Owned w = upload(*b.gpu, random_floats(static_cast<size_t>(N) * K, 301), DType::bf16, {N, K});
    const auto out33 = linear_rows(*b.gpu, x, w, 0, 33, N, K);
    const auto out8 = linear_rows(*b.gpu, x, w, 0, 8, N, K);
    for (int r : {0, 5, 7}) {
      // Row r alone (M = 1) vs inside M = 8 and M = 33.
      std::vector<float> xr(x.begin() + static_cast<size_t>(r) * K, x.begin() + static_cast<size_t>(r + 1) * K);
      const auto alone = linear_rows(*b.gpu, xr, w, 0, 1, N, K);
      EXPECT_TRUE(bit_equal(alone.data(), out8.data() + r * N, N)) << "row " << r << " K=" << K << " M=8";
      EXPECT_TRUE(bit_equal(alone.data(), out33.data() + r * N, N)) << "row " << r << " K=" << K << " M=33";
    }
    for (int r : {16, 32}) {
      std::vector<float> xr(x.begin() + static_cast<size_t>(r) * K, x.begin() + static_cast<size_t>(r + 1) * K);
      const auto alone = linear_rows(*b.gpu, xr, w, 0, 1, N, K);
      EXPECT_TRUE(bit_equal(alone.data(), out33.data() + r * N, N)) << "row " << r << " K=" << K << " M=33";
    }
  }
}

// Backend::allow_fast_kernels on a batch-invariant backend: inside the scope its linears give the
// fast mode's bits (a drafter's proposals), after it the invariant mode's again; with
// CudaTuning::fast_drafts off the scope changes nothing.
TEST(GpuLinear, AllowedFastKernelsGiveTheFastModesBits) {
  SPECDEC_REQUIRE_GPU();
  CudaTuning off;
  off.fast_drafts = false;
  const auto inv = make_gpu({}, true), fast = make_gpu({}, false), kept = make_gpu(off, true);
  const int N = 512, K = 1536;
  const auto x = random_floats(static_cast<size_t>(8) * K, 310);
  const auto w = random_floats(static_cast<size_t>(N) * K, 311);
  Owned wi = upload(*inv, w, DType::bf16, {N, K}), wf = upload(*fast, w, DType::bf16, {N, K}),
        wk = upload(*kept, w, DType::bf16, {N, K});
  for (int M : {1, 8}) {
    const std::string what = str_cat("M=", M);
    const auto invariant_bits = linear_rows(*inv, x, wi, 0, M, N, K);
    const auto fast_bits = linear_rows(*fast, x, wf, 0, M, N, K);
    // One row takes different kernels in the two modes (the fast mode's keeps x in f32): there
    // the scope's effect shows in the bits. (At eight rows both may pick an unsplit cuBLASLt.)
    if (M == 1) {
      EXPECT_FALSE(bit_equal(invariant_bits.data(), fast_bits.data(), fast_bits.size())) << what;
    }
    {
      const FastKernelScope scope(*inv, true);
      const auto got = linear_rows(*inv, x, wi, 0, M, N, K);
      EXPECT_TRUE(bit_equal(got.data(), fast_bits.data(), fast_bits.size())) << what << ": inside the scope";
      const FastKernelScope nested(*inv, false);
      const auto again = linear_rows(*inv, x, wi, 0, M, N, K);
      EXPECT_TRUE(bit_equal(again.data(), invariant_bits.data(), invariant_bits.size())) << what << ": nested off";
    }
    const auto after = linear_rows(*inv, x, wi, 0, M, N, K);
    EXPECT_TRUE(bit_equal(after.data(), invariant_bits.data(), invariant_bits.size())) << what << ": after the scope";
    const FastKernelScope ignored(*kept, true);
    const auto still = linear_rows(*kept, x, wk, 0, M, N, K);
    EXPECT_TRUE(bit_equal(still.data(), invariant_bits.data(), invariant_bits.size())) << what << ": fast_drafts off";
  }
}

// The batch-invariant mode's cuBLASLt path picks the fastest algorithm per M among those that
// keep K in one pass: tiles, clusters and kernels change with M, the bits of a row must not.
// Shapes of an 8B model's projections and two that are not multiples of 64, M from one row to a
// prefill chunk.
TEST(GpuLinear, InvariantModeRowBitsHoldAcrossCuBlasLtAlgorithms) {
  SPECDEC_REQUIRE_GPU();
  if (!invariant_rounds_x(DType::bf16, 4096, 4096)) GTEST_SKIP() << "the invariant mode's tensor-core linears are off";
  Backends b = make_backends(true);
  constexpr int kMaxM = 1024;
  for (auto [N, K] : {std::pair{1024, 4096}, std::pair{4096, 4096}, std::pair{4096, 14336}, std::pair{1000, 4096},
                      std::pair{4104, 1000}}) {
    const auto x = random_floats(static_cast<size_t>(kMaxM) * K, 400 + static_cast<uint32_t>(N));
    Owned w = upload(*b.gpu, random_floats(static_cast<size_t>(N) * K, 401), DType::bf16, {N, K});
    const auto all = linear_rows(*b.gpu, x, w, 0, kMaxM, N, K);
    for (int M : {1, 2, 4, 16, 64, 200, 512}) {
      for (int first : {0, kMaxM - M}) {
        const auto got = linear_rows(*b.gpu, x, w, first, M, N, K);
        EXPECT_TRUE(bit_equal(got.data(), all.data() + static_cast<size_t>(first) * N, got.size()))
            << "N=" << N << " K=" << K << " rows " << first << ".." << first + M - 1 << " of " << kMaxM;
      }
    }
  }
}

// The batch-invariant mode's linears of up to 16 rows may run on the ordered kernel
// (CudaTuning::ordered_max_m), which must give the bits of cuBLASLt with K unsplit: the kernel
// that serves the same mode's larger M. Every M from 1 to 16 on shapes of the bundled and the 8B
// models (K ending in half a 32-wide chunk included, bf16 and f16), with and without the
// residual add, against the same calls on cuBLASLt.
TEST(GpuLinear, InvariantOrderedKernelGivesCuBlasLtBits) {
  SPECDEC_REQUIRE_GPU();
  if (!invariant_rounds_x(DType::bf16, 4096, 4096)) GTEST_SKIP() << "the invariant mode's tensor-core linears are off";
  CudaTuning with, without;
  with.ordered_max_m = cuda::kOrderedMaxM;
  without.ordered_max_m = 0;
  const auto ordered = make_gpu(with, true), lt = make_gpu(without, true);
  struct Shape {
    int N, K;
    DType wt;
  };
  for (const Shape& c : {Shape{6144, 4096, DType::bf16}, Shape{4096, 4096, DType::bf16}, Shape{4096, 14336, DType::bf16},
                         Shape{8192, 512, DType::bf16}, Shape{1536, 512, DType::f16}, Shape{192, 208, DType::bf16},
                         Shape{512, 1536, DType::bf16}, Shape{24, 48, DType::f16}}) {
    constexpr int kMaxM = cuda::kOrderedMaxM;
    const auto x = random_floats(static_cast<size_t>(kMaxM) * c.K, 500 + static_cast<uint32_t>(c.N + c.K));
    const auto w = random_floats(static_cast<size_t>(c.N) * c.K, 501);
    const auto r = random_floats(static_cast<size_t>(kMaxM) * c.N, 502);
    Owned wo = upload(*ordered, w, c.wt, {c.N, c.K}), wl = upload(*lt, w, c.wt, {c.N, c.K});
    for (int M = 1; M <= kMaxM; ++M) {
      const std::string what = str_cat("M=", M, " N=", c.N, " K=", c.K, " ", dtype_name(c.wt));
      const uint64_t before = cuda::ordered_gemm_launches();
      const auto got = linear_rows(*ordered, x, wo, 0, M, c.N, c.K);
      EXPECT_EQ(cuda::ordered_gemm_launches(), before + 1) << what << ": not served by the ordered kernel";
      const auto want = linear_rows(*lt, x, wl, 0, M, c.N, c.K);
      EXPECT_EQ(cuda::ordered_gemm_launches(), before + 1) << what << ": ordered_max_m = 0 still took it";
      EXPECT_TRUE(bit_equal(got.data(), want.data(), want.size())) << what;
      if (M == 1 || M == 7 || M == 9 || M == kMaxM) {  // out = r + x · wᵀ
        std::vector<float> sums[2];
        const std::pair<Backend*, const Owned*> runs[2] = {{ordered.get(), &wo}, {lt.get(), &wl}};
        for (int i = 0; i < 2; ++i) {
          Backend& be = *runs[i].first;
          const size_t m = static_cast<size_t>(M);
          Owned xt = upload(be, std::vector<float>(x.begin(), x.begin() + m * c.K), DType::f32, {M, c.K});
          Owned out = upload(be, std::vector<float>(r.begin(), r.begin() + m * c.N), DType::f32, {M, c.N});
          be.linear_add(xt.tensor, Weight(runs[i].second->tensor), nullptr, out.tensor);
          sums[i] = download(be, out.tensor);
        }
        EXPECT_TRUE(bit_equal(sums[0].data(), sums[1].data(), sums[1].size())) << what << " (residual add)";
      }
    }
  }
}

// At M = 1 the linear is the stream kernel (a persistent grid, several columns per warp when N
// exceeds its warps, weights through asynchronous copies); its outputs must be the bits of the
// tiled kernel that serves M = 2, for the plain, residual-add and SwiGLU forms alike.
TEST(GpuLinear, SingleRowEqualsItsRowInAPairBits) {
  SPECDEC_REQUIRE_GPU();
  for (bool invariant : {true, false}) {
    Backends b = make_backends(invariant);
    Backend& g = *b.gpu;
    struct Case {
      int N, K;
      DType wt;
    };
    for (const Case& c : {Case{20000, 256, DType::bf16}, Case{9000, 512, DType::f16}, Case{5000, 128, DType::f32},
                          Case{72, 4096, DType::bf16}, Case{4100, 14336, DType::bf16}}) {
      const std::string what = str_cat("N=", c.N, " K=", c.K, " ", dtype_name(c.wt), " invariant=", invariant);
      const auto x = random_floats(2 * static_cast<size_t>(c.K), 400 + static_cast<uint32_t>(c.N));
      const auto wa_values = random_floats(static_cast<size_t>(c.N) * c.K, 401);
      Owned wa = upload(g, wa_values, c.wt, {c.N, c.K});
      Owned wb = upload(g, random_floats(static_cast<size_t>(c.N) * c.K, 402), c.wt, {c.N, c.K});
      Owned x1 = upload(g, std::vector<float>(x.begin(), x.begin() + c.K), DType::f32, {1, c.K});
      Owned x2 = upload(g, x, DType::f32, {2, c.K});
      const auto residual = random_floats(2 * static_cast<size_t>(c.N), 403);
      Owned o1 = empty(g, DType::f32, {1, c.N}), o2 = empty(g, DType::f32, {2, c.N});

      const uint64_t streamed = cuda::linear_stream_launches();
      g.linear(x1.tensor, Weight(wa.tensor), nullptr, o1.tensor);
      const bool rounds_x = invariant && invariant_rounds_x(c.wt, c.K, c.N);
      if (std::getenv("SPECDEC_CUDA_STREAM_LINEAR") == nullptr && !rounds_x) {  // the stream kernel ran
        EXPECT_EQ(cuda::linear_stream_launches(), streamed + 1) << what;
      }
      g.linear(x2.tensor, Weight(wa.tensor), nullptr, o2.tensor);
      const auto plain1 = download(g, o1.tensor), plain2 = download(g, o2.tensor);
      EXPECT_TRUE(bit_equal(plain1.data(), plain2.data(), c.N)) << what << " linear";
      const std::vector<float> x_row(x.begin(), x.begin() + c.K);
      const auto cpu =
          run_linear(*b.cpu, rounds_x ? rounded(x_row, c.wt) : x_row, wa_values, nullptr, {1, c.N, c.K, c.wt, false});
      EXPECT_LE(rel_error(plain1, cpu), rounds_x ? kMmaTol : 1e-5) << what << " against the CPU";

      g.gated_linear(x1.tensor, Weight(wa.tensor), Weight(wb.tensor), o1.tensor);
      g.gated_linear(x2.tensor, Weight(wa.tensor), Weight(wb.tensor), o2.tensor);
      const auto gated1 = download(g, o1.tensor), gated2 = download(g, o2.tensor);
      EXPECT_TRUE(bit_equal(gated1.data(), gated2.data(), c.N)) << what << " gated_linear";

      Owned r1 = upload(g, std::vector<float>(residual.begin(), residual.begin() + c.N), DType::f32, {1, c.N});
      Owned r2 = upload(g, residual, DType::f32, {2, c.N});
      g.linear_add(x1.tensor, Weight(wa.tensor), nullptr, r1.tensor);
      g.linear_add(x2.tensor, Weight(wa.tensor), nullptr, r2.tensor);
      const auto add1 = download(g, r1.tensor), add2 = download(g, r2.tensor);
      EXPECT_TRUE(bit_equal(add1.data(), add2.data(), c.N)) << what << " linear_add";

      // The RMSNorm folded into the call (one row and two rows of x take different kernels).
      Owned nw = upload(g, random_floats(static_cast<size_t>(c.K), 404), c.wt, {c.K});
      Owned n1 = empty(g, DType::f32, {1, c.K}), n2 = empty(g, DType::f32, {2, c.K});
      const std::array<Projection, 1> p1 = {Projection{Weight(wa.tensor), {}, o1.tensor}};
      const std::array<Projection, 1> p2 = {Projection{Weight(wa.tensor), {}, o2.tensor}};
      g.norm_linear_many(x1.tensor, nw.tensor, 1e-5f, n1.tensor, p1);
      g.norm_linear_many(x2.tensor, nw.tensor, 1e-5f, n2.tensor, p2);
      const auto normed1 = download(g, o1.tensor), normed2 = download(g, o2.tensor);
      EXPECT_TRUE(bit_equal(normed1.data(), normed2.data(), c.N)) << what << " norm_linear_many";
    }
  }
}

// More rows of x than one launch's grid holds (65,535 tiles of 16 rows): the invariant mode's
// row kernel takes them in slices; every row of the plain, SwiGLU and residual-add forms matches
// the CPU, the last slice's rows included.
TEST(GpuLinear, MoreRowsThanOneGridMatchCpu) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends(true);
  const int M = 65535 * 16 + 21, N = 24, K = 32;
  const auto x = random_floats(static_cast<size_t>(M) * K, 500);
  const auto wa = random_floats(static_cast<size_t>(N) * K, 501), wb = random_floats(static_cast<size_t>(N) * K, 502);
  const auto residual = random_floats(static_cast<size_t>(M) * N, 503);
  std::vector<float> got[3], want[3];
  for (int side = 0; side < 2; ++side) {
    Backend& be = side == 0 ? *b.gpu : *b.cpu;
    // The tensor-core linear (K = 32, bf16) rounds x to bf16: the CPU takes it so rounded.
    const bool rounds_x = side == 1 && invariant_rounds_x(DType::bf16, K, N);
    Owned xt = upload(be, rounds_x ? rounded(x, DType::bf16) : x, DType::f32, {M, K});
    Owned at = upload(be, wa, DType::bf16, {N, K}), bt = upload(be, wb, DType::bf16, {N, K});
    Owned o = upload(be, std::vector<float>(static_cast<size_t>(M) * N, NAN), DType::f32, {M, N});
    auto& into = side == 0 ? got : want;
    be.linear(xt.tensor, Weight(at.tensor), nullptr, o.tensor);
    into[0] = download(be, o.tensor);
    be.gated_linear(xt.tensor, Weight(at.tensor), Weight(bt.tensor), o.tensor);
    into[1] = download(be, o.tensor);
    Owned r = upload(be, residual, DType::f32, {M, N});
    be.linear_add(xt.tensor, Weight(at.tensor), nullptr, r.tensor);
    into[2] = download(be, r.tensor);
  }
  const double tol = invariant_rounds_x(DType::bf16, K, N) ? kMmaTol : 1e-5;
  EXPECT_LE(rel_error(got[0], want[0]), tol) << "linear";
  // The CPU keeps the gate and up products in f32: a bf16 step apart where the GPU rounds them.
  EXPECT_LE(rel_error(got[1], want[1]), invariant_rounds_gate_up(DType::bf16, K, N) ? 1.0 / 128 : tol)
      << "gated_linear";
  EXPECT_LE(rel_error(got[2], want[2]), tol) << "linear_add";
}

TEST(GpuLinear, RejectsMismatchedShapes) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends(true);
  Owned x = empty(*b.gpu, DType::f32, {2, 64});
  Owned w = empty(*b.gpu, DType::bf16, {16, 32});
  Owned o = empty(*b.gpu, DType::f32, {2, 16});
  EXPECT_THROW(b.gpu->linear(x.tensor, Weight(w.tensor), nullptr, o.tensor), Error);
}

}  // namespace
}  // namespace specdec::gpu_test
