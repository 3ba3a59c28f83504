// The tensor-core linear (batch-invariant mode, 16-bit weights): a row's output bits are the same
// whatever M it is computed in (one row, a verify window, a prefill chunk, a large batch), at any
// offset in the batch, under every tile, and for the fused forms; and the outputs agree with an
// f64 reference on x rounded to the weights' type.
#include <array>

#include "gpu/gpu_test_util.h"

namespace specdec::gpu_test {
namespace {

// The batch-invariant mode on the tensor-core linear, with the given kernel.
std::unique_ptr<Backend> tensor_core_gpu(int gemm_tile = 0) {
  CudaTuning t;
  t.invariant_tensor_cores = true;
  t.gemm_tile = gemm_tile;
  return make_gpu(t);
}

// out[m, n] = sum_k x16[m, k] * w16[n, k] in f64, x16 and w16 the 16-bit roundings.
std::vector<float> reference(const std::vector<float>& x, const std::vector<float>& w, int M, int N, int K, DType wt) {
  const auto xr = rounded(x, wt), wr = rounded(w, wt);
  std::vector<float> out(static_cast<size_t>(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = 0.0;
      for (int k = 0; k < K; ++k) s += double(xr[size_t(m) * K + k]) * wr[size_t(n) * K + k];
      out[size_t(m) * N + n] = static_cast<float>(s);
    }
  return out;
}

TEST(GpuGemm, RowBitsEqualAtEveryM) {
  SPECDEC_REQUIRE_GPU();
  auto g = tensor_core_gpu();
  struct Case {
    int N, K;
    DType wt;
  };
  for (const Case& c : {Case{300, 4096, DType::bf16}, Case{1000, 1000, DType::bf16}, Case{72, 14336, DType::bf16},
                        Case{136, 520, DType::f16}}) {
    const int big = 1000;
    const auto x = random_floats(size_t(big) * c.K, 700 + c.K);
    const auto wv = random_floats(size_t(c.N) * c.K, 701 + c.N);
    Owned w = upload(*g, wv, c.wt, {c.N, c.K});
    const auto all = linear_rows(*g, x, w, 0, big, c.N, c.K);
    const std::string what = str_cat("N=", c.N, " K=", c.K, " ", dtype_name(c.wt));
    // A prefix of the batch at M = 1, 3, 16, 100, and windows at other offsets.
    for (int M : {1, 3, 16, 100}) {
      const auto part = linear_rows(*g, x, w, 0, M, c.N, c.K);
      EXPECT_TRUE(bit_equal(part.data(), all.data(), size_t(M) * c.N)) << what << " rows [0, " << M << ")";
    }
    for (auto [first, M] :
         {std::pair{517, 1}, std::pair{998, 2}, std::pair{131, 3}, std::pair{500, 17}, std::pair{777, 200}}) {
      const auto part = linear_rows(*g, x, w, first, M, c.N, c.K);
      EXPECT_TRUE(bit_equal(part.data(), all.data() + size_t(first) * c.N, size_t(M) * c.N))
          << what << " rows [" << first << ", " << first + M << ")";
    }
    // Every kernel and tile gives the same bits (the choice follows M by default; the stream
    // kernel takes up to 16 rows, and hands more to the small tile).
    for (int tile : {1, 2, 3, 4, 5, 6, 7, 8, 9}) {
      auto gt = tensor_core_gpu(tile);
      Owned wt = upload(*gt, wv, c.wt, {c.N, c.K});
      for (auto [first, M] : {std::pair{0, 1}, std::pair{5, 16}, std::pair{40, 60}, std::pair{0, big}}) {
        const auto part = linear_rows(*gt, x, wt, first, M, c.N, c.K);
        EXPECT_TRUE(bit_equal(part.data(), all.data() + size_t(first) * c.N, size_t(M) * c.N))
            << what << " tile " << tile << " rows [" << first << ", " << first + M << ")";
      }
    }
    // Against f64 on the rounded operands: the MMA's f32 sums of a k-step do not round like a
    // chain of fma; a few units of 2^-24 relative per step.
    const int check = 24;
    const auto want =
        reference(std::vector<float>(x.begin(), x.begin() + size_t(check) * c.K), wv, check, c.N, c.K, c.wt);
    EXPECT_LE(rel_error(std::vector<float>(all.begin(), all.begin() + size_t(check) * c.N), want), 5e-5) << what;
  }
}

// The fused forms (q/k/v in one call with a bias, SwiGLU, residual add) are the same dot
// products: one row alone equals its row in a batch of 100, and each form matches the f64
// reference composed on the host.
TEST(GpuGemm, FusedFormsRowBitsAndReference) {
  SPECDEC_REQUIRE_GPU();
  auto g = tensor_core_gpu();
  const int K = 512, Nq = 256, Nkv = 72, I = 344, big = 100, row = 37;
  const DType wt = DType::bf16;
  const auto x = random_floats(size_t(big) * K, 801);
  const auto wq = random_floats(size_t(Nq) * K, 802), wk = random_floats(size_t(Nkv) * K, 803);
  const auto wg = random_floats(size_t(I) * K, 804), wu = random_floats(size_t(I) * K, 805);
  const auto bq = random_floats(size_t(Nq), 806), res = random_floats(size_t(big) * Nq, 807);
  Owned tq = upload(*g, wq, wt, {Nq, K}), tk = upload(*g, wk, wt, {Nkv, K});
  Owned tg = upload(*g, wg, wt, {I, K}), tu = upload(*g, wu, wt, {I, K});
  Owned tb = upload(*g, bq, DType::f32, {Nq});
  struct Out {
    std::vector<float> q, k, gated, added;
  };
  const auto run = [&](int first, int M) {
    Owned xt = upload(*g, std::vector<float>(x.begin() + size_t(first) * K, x.begin() + size_t(first + M) * K),
                      DType::f32, {M, K});
    Owned q = empty(*g, DType::f32, {M, Nq}), k = empty(*g, DType::f32, {M, Nkv}), gate = empty(*g, DType::f32, {M, I});
    Owned r = upload(*g, std::vector<float>(res.begin() + size_t(first) * Nq, res.begin() + size_t(first + M) * Nq),
                     DType::f32, {M, Nq});
    const std::array<Projection, 2> p = {Projection{Weight(tq.tensor), tb.tensor, q.tensor},
                                         Projection{Weight(tk.tensor), {}, k.tensor}};
    g->linear_many(xt.tensor, p);
    g->gated_linear(xt.tensor, Weight(tg.tensor), Weight(tu.tensor), gate.tensor);
    g->linear_add(xt.tensor, Weight(tq.tensor), nullptr, r.tensor);
    return Out{download(*g, q.tensor), download(*g, k.tensor), download(*g, gate.tensor), download(*g, r.tensor)};
  };
  const Out all = run(0, big), one = run(row, 1);
  EXPECT_TRUE(bit_equal(one.q.data(), all.q.data() + row * Nq, Nq)) << "q";
  EXPECT_TRUE(bit_equal(one.k.data(), all.k.data() + row * Nkv, Nkv)) << "k";
  EXPECT_TRUE(bit_equal(one.gated.data(), all.gated.data() + row * I, I)) << "gated";
  EXPECT_TRUE(bit_equal(one.added.data(), all.added.data() + row * Nq, Nq)) << "added";

  const auto q = reference(x, wq, big, Nq, K, wt), k = reference(x, wk, big, Nkv, K, wt);
  const auto gd = reference(x, wg, big, I, K, wt), up = reference(x, wu, big, I, K, wt);
  std::vector<float> want_q(q), want_gated(gd.size()), want_added(q);
  for (int m = 0; m < big; ++m)
    for (int n = 0; n < Nq; ++n) {
      want_q[size_t(m) * Nq + n] = q[size_t(m) * Nq + n] + bq[n];
      want_added[size_t(m) * Nq + n] = res[size_t(m) * Nq + n] + q[size_t(m) * Nq + n];
    }
  for (size_t i = 0; i < gd.size(); ++i)
    want_gated[i] = static_cast<float>(gd[i] / (1.0 + std::exp(-double(gd[i]))) * up[i]);
  EXPECT_LE(rel_error(all.q, want_q), 5e-5);
  EXPECT_LE(rel_error(all.k, k), 5e-5);
  EXPECT_LE(rel_error(all.gated, want_gated), 5e-5);
  EXPECT_LE(rel_error(all.added, want_added), 5e-5);
}

}  // namespace
}  // namespace specdec::gpu_test
