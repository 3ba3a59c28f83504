// CudaTuning (BackendOptions::cuda): each backend follows its own switches, the alternatives
// trade only speed (the linear family gives the defaults' bits under each), and a value outside
// a switch's range is refused when the backend is made.
#include <array>
#include <cstdlib>
#include <string>
#include <utility>

#include "gpu/gpu_test_util.h"

namespace specdec::gpu_test {
namespace {

// A decode layer's linears on M rows: q/k/v and gate*up with the norm folded, down added into
// the residual. Same inputs on every backend.
std::vector<std::vector<float>> run_linears(Backend& g, int M, int K, int Nq, int Nkv, int I, DType wt) {
  Owned wq = upload(g, random_floats(size_t(Nq) * K, 51), wt, {Nq, K});
  Owned wk = upload(g, random_floats(size_t(Nkv) * K, 52), wt, {Nkv, K});
  Owned wv = upload(g, random_floats(size_t(Nkv) * K, 53), wt, {Nkv, K});
  Owned bq = upload(g, random_floats(size_t(Nq), 54), DType::f32, {Nq});
  Owned wg = upload(g, random_floats(size_t(I) * K, 55), wt, {I, K});
  Owned wu = upload(g, random_floats(size_t(I) * K, 56), wt, {I, K});
  Owned wd = upload(g, random_floats(size_t(K) * I, 57), wt, {K, I});
  Owned norm1 = upload(g, random_floats(size_t(K), 58), wt, {K});
  Owned norm2 = upload(g, random_floats(size_t(K), 59), wt, {K});
  Owned x = upload(g, random_floats(size_t(M) * K, 60, 0.05f, 2.0f), DType::f32, {M, K});
  Owned res = upload(g, random_floats(size_t(M) * K, 61), DType::f32, {M, K});
  Owned h = empty(g, DType::f32, {M, K});
  Owned q = empty(g, DType::f32, {M, Nq}), k = empty(g, DType::f32, {M, Nkv}), v = empty(g, DType::f32, {M, Nkv});
  Owned gate = empty(g, DType::f32, {M, I});
  const std::array<Projection, 3> p = {Projection{Weight(wq.tensor), bq.tensor, q.tensor},
                                       Projection{Weight(wk.tensor), {}, k.tensor},
                                       Projection{Weight(wv.tensor), {}, v.tensor}};
  const float eps = 1e-5f;
  g.norm_linear_many(x.tensor, norm1.tensor, eps, h.tensor, p);
  g.norm_gated_linear(x.tensor, norm2.tensor, eps, h.tensor, Weight(wg.tensor), Weight(wu.tensor), gate.tensor);
  g.linear_add(gate.tensor, Weight(wd.tensor), nullptr, res.tensor);
  return {download(g, q.tensor), download(g, k.tensor), download(g, v.tensor), download(g, gate.tensor),
          download(g, res.tensor)};
}

TEST(GpuTuning, AlternativesComputeTheDefaultsBits) {
  SPECDEC_REQUIRE_GPU();
  std::vector<std::pair<std::string, CudaTuning>> alternatives;
  CudaTuning t;
  t.stream_linear = false;
  alternatives.emplace_back("stream_linear off", t);
  t = {};
  t.paired_columns = PairedColumns::never;
  alternatives.emplace_back("paired never", t);
  t.paired_columns = PairedColumns::always;
  alternatives.emplace_back("paired always", t);
  t = {};
  t.overlapped_launches = false;
  t.early_weights = 0;
  alternatives.emplace_back("no overlap, no early weights", t);
  t.overlapped_launches = true;
  t.early_weights = 1;
  alternatives.emplace_back("one early weight vector", t);

  auto defaults = make_gpu(CudaTuning{});
  for (int M : {1, 2, 40}) {
    for (DType wt : {DType::bf16, DType::f32}) {
      const auto want = run_linears(*defaults, M, 512, 256, 64, 704, wt);
      for (const auto& [name, tuning] : alternatives) {
        auto g = make_gpu(tuning);
        const auto got = run_linears(*g, M, 512, 256, 64, 704, wt);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(got[i].size(), want[i].size());
          EXPECT_TRUE(bit_equal(got[i].data(), want[i].data(), want[i].size()))
              << name << " M=" << M << " " << dtype_name(wt) << " output " << i;
        }
      }
    }
  }
}

TEST(GpuTuning, RefusesValuesOutsideTheirRange) {
  SPECDEC_REQUIRE_GPU();
  if (std::getenv("SPECDEC_CUDA_EARLY_WEIGHTS") == nullptr) {  // the environment would replace the value
    CudaTuning t;
    t.early_weights = 3;
    EXPECT_THROW(make_gpu(t), Error);
  }
  if (std::getenv("SPECDEC_CUDA_PAIRED") == nullptr) {
    CudaTuning t;
    t.paired_columns = static_cast<PairedColumns>(3);
    EXPECT_THROW(make_gpu(t), Error);
  }
  if (std::getenv("SPECDEC_CUDA_FLASH_DECODE_BLOCKS") == nullptr) {
    CudaTuning t;
    t.flash_decode_blocks = -1;
    EXPECT_THROW(make_gpu(t), Error);
  }
}

}  // namespace
}  // namespace specdec::gpu_test
