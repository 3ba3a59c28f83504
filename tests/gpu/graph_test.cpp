// Backend::record on the CUDA backend: a recorded sequence of calls, replayed after new inputs
// are written into the same buffers, gives exactly what running the calls gives; a recording
// refuses to replay once the backend moved a buffer it used; the CPU backend records nothing.
#include "gpu/gpu_test_util.h"

namespace specdec::gpu_test {
namespace {

TEST(GpuRecord, ReplayEqualsCalls) {
  SPECDEC_REQUIRE_GPU();
  for (bool invariant : {true, false}) {
    Backends b = make_backends(invariant);
    Backend& g = *b.gpu;
    const int M = 16, K = 256, N = 128;  // M > 2: the fast mode takes its cuBLASLt path
    Owned x = upload(g, random_floats(M * K, 1), DType::f32, {M, K});
    Owned nw = upload(g, random_floats(K, 2, 0.5f, 1.5f), DType::bf16, {K});
    Owned w = upload(g, random_floats(N * K, 3), DType::bf16, {N, K});
    Owned wu = upload(g, random_floats(N * K, 5), DType::bf16, {N, K});
    Owned wd = upload(g, random_floats(K * N, 6), DType::bf16, {K, N});
    Owned h = empty(g, DType::f32, {M, K});
    Owned out = empty(g, DType::f32, {M, N});
    const auto step = [&] {
      g.rms_norm(x.tensor, nw.tensor, 1e-5f, h.tensor);
      g.gated_linear(h.tensor, Weight(w.tensor), Weight(wu.tensor), out.tensor);
      g.linear_add(out.tensor, Weight(wd.tensor), nullptr, x.tensor);
    };
    step();  // the first run creates the lazily made state (scratch, GEMM plans)
    const std::unique_ptr<RecordedCalls> recorded = g.record(step);
    ASSERT_TRUE(recorded);

    const auto x2 = random_floats(M * K, 4);
    Owned fresh = upload(g, x2, DType::f32, {M, K});
    g.copy(fresh.tensor, x.tensor);  // new input into the recorded buffer
    ASSERT_TRUE(recorded->replay());
    const auto replayed = download(g, x.tensor);
    g.copy(fresh.tensor, x.tensor);
    step();
    const auto called = download(g, x.tensor);
    EXPECT_TRUE(bit_equal(replayed.data(), called.data(), called.size())) << "invariant=" << invariant;
  }
}

TEST(GpuRecord, StaleAfterScratchGrows) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends(false);
  Backend& g = *b.gpu;
  const int K = 256, N = 64;
  Owned w = upload(g, random_floats(N * K, 3), DType::bf16, {N, K});
  Owned x = upload(g, random_floats(4 * K, 1), DType::f32, {4, K});
  Owned out = empty(g, DType::f32, {4, N});
  const auto step = [&] { g.linear(x.tensor, Weight(w.tensor), nullptr, out.tensor); };
  step();
  const std::unique_ptr<RecordedCalls> recorded = g.record(step);
  ASSERT_TRUE(recorded);
  EXPECT_TRUE(recorded->replay());
  // A much larger call makes the fast mode's scratch (x in bf16) grow: the recording is stale.
  const int big = 4096;
  Owned xb = upload(g, random_floats(size_t{big} * K, 7), DType::f32, {big, K});
  Owned ob = empty(g, DType::f32, {big, N});
  g.linear(xb.tensor, Weight(w.tensor), nullptr, ob.tensor);
  EXPECT_FALSE(recorded->replay());
}

TEST(GpuRecord, CpuBackendRecordsNothing) {
  BackendOptions c;
  c.device = Device::cpu;
  auto cpu = make_backend(c);
  bool ran = false;
  EXPECT_EQ(cpu->record([&] { ran = true; }), nullptr);
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace specdec::gpu_test
