// CUDA backend vs the scalar CPU backend for the row-wise kernels: embedding, rms_norm, rope,
// silu_mul, add, gather_rows, scatter_columns, argmax, top_logprob, and copies. f32 results must agree to 1e-5
// relative.
#include "gpu/gpu_test_util.h"
#include <algorithm>
#include <cmath>
#include <limits>

namespace specdec::gpu_test {
namespace {

constexpr double kF32Tol = 1e-5;

class GpuKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    SPECDEC_REQUIRE_GPU();
    b_ = make_backends();
  }
  Backends b_;
};

TEST_F(GpuKernels, CopyRoundTripsHostAndDevice) {
  const auto v = random_floats(1000, 1);
  Owned a = upload(*b_.gpu, v, DType::f32, {10, 100});
  Owned c = empty(*b_.gpu, DType::f32, {10, 100});
  b_.gpu->copy(a.tensor, c.tensor);  // device to device
  EXPECT_EQ(download(*b_.gpu, c.tensor), v);
}

TEST_F(GpuKernels, EmbeddingMatchesCpu) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const int V = 300, H = 130, T = 7;
    const auto table = random_floats(V * H, 2);
    const std::vector<int32_t> ids = {5, 0, 299, 17, 5, 123, 42};
    std::vector<std::vector<float>> results;
    for (Backend* be : {b_.cpu.get(), b_.gpu.get()}) {
      Owned t = upload(*be, table, dt, {V, H});
      Owned i = upload_i32(*be, ids, {T});
      Owned o = empty(*be, DType::f32, {T, H});
      be->embedding(t.tensor, i.tensor, o.tensor);
      results.push_back(download(*be, o.tensor));
    }
    EXPECT_EQ(results[1], results[0]) << dtype_name(dt);  // a conversion: exact
  }
}

TEST_F(GpuKernels, RmsNormMatchesCpu) {
  for (DType wt : {DType::f32, DType::bf16}) {
    for (int D : {64, 1000, 4096}) {
      const int rows = 5;
      const auto x = random_floats(static_cast<size_t>(rows) * D, 3, 0.05f, 3.0f);
      const auto w = random_floats(static_cast<size_t>(D), 4, 0.5f, 1.5f);
      std::vector<std::vector<float>> results;
      for (Backend* be : {b_.cpu.get(), b_.gpu.get()}) {
        Owned xt = upload(*be, x, DType::f32, {rows, D});
        Owned wtn = upload(*be, w, wt, {D});
        Owned o = empty(*be, DType::f32, {rows, D});
        be->rms_norm(xt.tensor, wtn.tensor, 1e-5f, o.tensor);
        results.push_back(download(*be, o.tensor));
        be->rms_norm(xt.tensor, wtn.tensor, 1e-5f, xt.tensor);  // in place gives the same
        EXPECT_EQ(download(*be, xt.tensor), results.back()) << be->name();
      }
      EXPECT_LE(rel_error(results[1], results[0]), kF32Tol) << "D=" << D << " weight " << dtype_name(wt);
    }
  }
}

TEST_F(GpuKernels, RopeMatchesCpu) {
  for (int D : {32, 64, 128}) {
    const int T = 6, heads = 4;
    const auto x = random_floats(static_cast<size_t>(T) * heads * D, 5);
    const std::vector<int32_t> pos = {0, 1, 7, 511, 4095, 100000};
    std::vector<float> inv_freq(static_cast<size_t>(D / 2));
    for (int i = 0; i < D / 2; ++i) inv_freq[static_cast<size_t>(i)] = std::pow(500000.0f, -2.0f * i / D);
    std::vector<std::vector<float>> results;
    for (Backend* be : {b_.cpu.get(), b_.gpu.get()}) {
      Owned xt = upload(*be, x, DType::f32, {T, heads, D});
      Owned p = upload_i32(*be, pos, {T});
      Owned f = upload(*be, inv_freq, DType::f32, {D / 2});
      be->rope(xt.tensor, p.tensor, f.tensor, 1.25f);
      results.push_back(download(*be, xt.tensor));
    }
    EXPECT_LE(rel_error(results[1], results[0]), kF32Tol) << "head_dim " << D;
  }
}

TEST_F(GpuKernels, SiluMulAndAddMatchCpu) {
  const int M = 3, I = 5000;
  const auto g = random_floats(M * I, 6, 0.05f, 8.0f), u = random_floats(M * I, 7);
  std::vector<std::vector<float>> silu, sum;
  for (Backend* be : {b_.cpu.get(), b_.gpu.get()}) {
    Owned gt = upload(*be, g, DType::f32, {M, I});
    Owned ut = upload(*be, u, DType::f32, {M, I});
    Owned o = empty(*be, DType::f32, {M, I});
    be->silu_mul(gt.tensor, ut.tensor, o.tensor);
    silu.push_back(download(*be, o.tensor));
    be->add(gt.tensor, ut.tensor, o.tensor);
    sum.push_back(download(*be, o.tensor));
    be->silu_mul(gt.tensor, ut.tensor, gt.tensor);  // in place into gate
    EXPECT_EQ(download(*be, gt.tensor), silu.back());
  }
  EXPECT_LE(rel_error(silu[1], silu[0]), kF32Tol);
  EXPECT_EQ(sum[1], sum[0]);  // one rounding, same on both
}

TEST_F(GpuKernels, GatherRowsMatchesCpu) {
  const int T = 9, H = 77;
  const auto x = random_floats(T * H, 8);
  const std::vector<int32_t> idx = {8, 0, 3, 3};
  std::vector<std::vector<float>> results;
  for (Backend* be : {b_.cpu.get(), b_.gpu.get()}) {
    Owned xt = upload(*be, x, DType::f32, {T, H});
    Owned i = upload_i32(*be, idx, {4});
    Owned o = empty(*be, DType::f32, {4, H});
    be->gather_rows(xt.tensor, i.tensor, o.tensor);
    results.push_back(download(*be, o.tensor));
  }
  EXPECT_EQ(results[1], results[0]);
  EXPECT_EQ(results[1][0], x[8 * H]);
}

TEST_F(GpuKernels, ScatterColumnsMatchesCpu) {
  // A reduced vocabulary of 5 columns laid over 4,100 target ids (more than a block's threads):
  // the rest at -inf, an index outside the vocabulary dropped, two columns on one id with equal
  // values.
  const int n = 3, C = 6, V = 4100;
  auto x = random_floats(static_cast<size_t>(n) * C, 12);
  for (int r = 0; r < n; ++r) x[static_cast<size_t>(r * C + 5)] = x[static_cast<size_t>(r * C + 1)];
  const std::vector<int32_t> index = {4099, 17, 0, 2048, V, 17};
  std::vector<std::vector<float>> results;
  for (Backend* be : {b_.cpu.get(), b_.gpu.get()}) {
    Owned xt = upload(*be, x, DType::f32, {n, C});
    Owned i = upload_i32(*be, index, {C});
    Owned o = empty(*be, DType::f32, {n, V});
    be->scatter_columns(xt.tensor, i.tensor, -std::numeric_limits<float>::infinity(), o.tensor);
    results.push_back(download(*be, o.tensor));
  }
  EXPECT_EQ(results[1], results[0]);
  for (int r = 0; r < n; ++r) {
    const float* row = results[1].data() + static_cast<size_t>(r) * V;
    EXPECT_EQ(row[4099], x[static_cast<size_t>(r * C)]);
    EXPECT_EQ(row[17], x[static_cast<size_t>(r * C + 1)]);
    EXPECT_EQ(row[0], x[static_cast<size_t>(r * C + 2)]);
    EXPECT_EQ(row[2048], x[static_cast<size_t>(r * C + 3)]);
    EXPECT_EQ(std::count_if(row, row + V, [](float v) { return std::isinf(v); }), V - 4);
  }
}

TEST_F(GpuKernels, ArgmaxTakesLowestIndexOnTies) {
  const int n = 4, V = 128256;
  auto logits = random_floats(static_cast<size_t>(n) * V, 9, 0.05f, 10.0f);
  // Row 0: a single maximum at the end; row 1: tied maxima, the lowest must win;
  // row 2: tie across thread strides; row 3: maximum at index 0.
  logits[0 * V + V - 1] = 50.0f;
  logits[1 * V + 70000] = 50.0f;
  logits[1 * V + 1000] = 50.0f;
  logits[1 * V + 128000] = 50.0f;
  logits[2 * V + 513] = 50.0f;
  logits[2 * V + 1] = 50.0f;
  logits[3 * V + 0] = 50.0f;
  std::vector<std::vector<int32_t>> results;
  for (Backend* be : {b_.cpu.get(), b_.gpu.get()}) {
    Owned l = upload(*be, logits, DType::f32, {n, V});
    Owned o = empty(*be, DType::i32, {n});
    be->argmax(l.tensor, o.tensor);
    results.push_back(download_i32(*be, o.tensor));
  }
  EXPECT_EQ(results[1], (std::vector<int32_t>{V - 1, 1000, 1, 0}));
  EXPECT_EQ(results[1], results[0]);
}

TEST_F(GpuKernels, ArgmaxOfARowWithANaNIsMinusOneOnBothBackends) {
  const int n = 3, V = 4096;
  auto logits = random_floats(static_cast<size_t>(n) * V, 11, 0.05f, 10.0f);
  logits[0 * V + 7] = std::numeric_limits<float>::quiet_NaN();
  logits[1 * V + V - 1] = std::numeric_limits<float>::quiet_NaN();
  logits[2 * V + 100] = 50.0f;  // no NaN: a token
  for (Backend* be : {b_.cpu.get(), b_.gpu.get()}) {
    Owned l = upload(*be, logits, DType::f32, {n, V});
    Owned o = empty(*be, DType::i32, {n});
    be->argmax(l.tensor, o.tensor);
    EXPECT_EQ(download_i32(*be, o.tensor), (std::vector<int32_t>{-1, -1, 100})) << be->name();
  }
}

TEST_F(GpuKernels, TopLogprobMatchesCpu) {
  for (const int V : {8192, 128256}) {
    const int n = 4;
    auto logits = random_floats(static_cast<size_t>(n) * V, 12, 0.05f, 10.0f);
    for (int v = 0; v < V; ++v) logits[static_cast<size_t>(V + v)] = 1.0f;  // row 1 flat: -log V
    logits[2 * static_cast<size_t>(V) + 77] = 40.0f;                        // row 2 nearly sure: ~0
    logits[3 * static_cast<size_t>(V) + 9] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::vector<float>> results;
    for (Backend* be : {b_.cpu.get(), b_.gpu.get()}) {
      Owned l = upload(*be, logits, DType::f32, {n, V});
      Owned o = empty(*be, DType::f32, {n});
      be->top_logprob(l.tensor, o.tensor);
      results.push_back(download(*be, o.tensor));
    }
    EXPECT_NEAR(results[1][1], -std::log(static_cast<double>(V)), 1e-4) << V;
    for (int r = 0; r < 3; ++r) EXPECT_NEAR(results[1][r], results[0][r], 1e-4 + 1e-5 * std::abs(results[0][r])) << V;
    EXPECT_TRUE(std::isnan(results[1][3]) && std::isnan(results[0][3])) << V;
  }
}

TEST_F(GpuKernels, RejectsHostTensors) {
  const auto v = random_floats(16, 10);
  Owned host = upload(*b_.cpu, v, DType::f32, {16});
  Owned dev = empty(*b_.gpu, DType::f32, {16});
  try {
    b_.gpu->add(host.tensor, dev.tensor, dev.tensor);
    FAIL() << "add accepted a host tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda memory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace specdec::gpu_test
