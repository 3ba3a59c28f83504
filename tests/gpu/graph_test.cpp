// CudaGraphRunner: a captured sequence of backend calls, replayed after new inputs are written
// into the same buffers, gives exactly what running the calls eagerly gives.
#include "backend/cuda/cuda_graph.h"
#include "gpu/gpu_test_util.h"

namespace specdec::gpu_test {
namespace {

TEST(GpuGraph, ReplayEqualsEagerCalls) {
  SPECDEC_REQUIRE_GPU();
  for (bool invariant : {true, false}) {
    Backends b = make_backends(invariant);
    Backend& g = *b.gpu;
    const int M = 16, K = 256, N = 128;  // M > 2: the fast mode takes its cuBLASLt path
    Owned x = upload(g, random_floats(M * K, 1), DType::f32, {M, K});
    Owned nw = upload(g, random_floats(K, 2, 0.5f, 1.5f), DType::bf16, {K});
    Owned w = upload(g, random_floats(N * K, 3), DType::bf16, {N, K});
    Owned h = empty(g, DType::f32, {M, K});
    Owned out = empty(g, DType::f32, {M, N});
    const auto step = [&] {
      g.rms_norm(x.tensor, nw.tensor, 1e-5f, h.tensor);
      g.linear(h.tensor, w.tensor, nullptr, out.tensor);
      g.silu_mul(out.tensor, out.tensor, out.tensor);
    };
    step();  // eager warm-up creates the lazily made state before capture
    CudaGraphRunner runner(g);
    runner.capture(step);
    ASSERT_TRUE(runner.captured());

    const auto x2 = random_floats(M * K, 4);
    Owned fresh = upload(g, x2, DType::f32, {M, K});
    g.copy(fresh.tensor, x.tensor);  // new input into the captured buffer
    runner.replay();
    const auto replayed = download(g, out.tensor);
    step();
    const auto eager = download(g, out.tensor);
    EXPECT_TRUE(bit_equal(replayed.data(), eager.data(), eager.size())) << "invariant=" << invariant;
  }
}

TEST(GpuGraph, RefusesCpuBackend) {
  BackendOptions c;
  c.device = Device::cpu;
  auto cpu = make_backend(c);
  EXPECT_THROW(CudaGraphRunner{*cpu}, Error);
}

}  // namespace
}  // namespace specdec::gpu_test
