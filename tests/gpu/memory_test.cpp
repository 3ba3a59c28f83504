// The CUDA backend's memory pool: the cap of BackendOptions::memory_limit is enforced with an
// error naming the request and the cap, and freed memory becomes available again.
#include "gpu/gpu_test_util.h"

namespace specdec::gpu_test {
namespace {

TEST(GpuMemory, LimitIsEnforcedWithAClearError) {
  SPECDEC_REQUIRE_GPU();
  BackendOptions o;
  o.device = Device::cuda;
  o.memory_limit = size_t{1} << 20;
  auto be = make_backend(o);
  Buffer half = be->allocate(size_t{1} << 19);
  ASSERT_NE(half.data(), nullptr);
  EXPECT_EQ(half.device(), Device::cuda);
  try {
    Buffer too_much = be->allocate(size_t{1} << 20);
    FAIL() << "allocating past the cap succeeded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("memory limit"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1048576 bytes"), std::string::npos) << msg;  // the request and the cap
    EXPECT_NE(msg.find("524288 bytes already in use"), std::string::npos) << msg;
  }
  half = Buffer();  // freed: the whole cap is available again
  Buffer all = be->allocate(size_t{1} << 20);
  EXPECT_NE(all.data(), nullptr);
}

TEST(GpuMemory, BuffersMayOutliveTheBackend) {
  SPECDEC_REQUIRE_GPU();
  Buffer kept;
  {
    BackendOptions o;
    o.device = Device::cuda;
    auto be = make_backend(o);
    kept = be->allocate(4096);
    const auto v = random_floats(1024, 1);
    Tensor host(const_cast<float*>(v.data()), DType::f32, {1024});
    Tensor dev(kept.data(), DType::f32, {1024}, Device::cuda);
    be->copy(host, dev);
    std::vector<float> back(1024);
    be->copy(dev, Tensor(back.data(), DType::f32, {1024}));
    EXPECT_EQ(back, v);
  }
  kept = Buffer();  // released after the backend is gone: must not crash (the process would end here)
}

// A copy into staging memory is queued behind the calls before it and is there once its fence
// is waited for: here behind a kernel that writes what is copied (the uploads before it waited
// for at a fence of their own).
TEST(GpuMemory, StagingCopiesArriveAtTheirFence) {
  SPECDEC_REQUIRE_GPU();
  BackendOptions o;
  o.device = Device::cuda;
  auto be = make_backend(o);
  EXPECT_TRUE(be->queues_calls());
  const int64_t n = 1 << 20;
  const auto a = random_floats(static_cast<size_t>(n), 2), b = random_floats(static_cast<size_t>(n), 3);
  Buffer da = be->allocate(static_cast<size_t>(n) * 4), db = be->allocate(static_cast<size_t>(n) * 4),
         dc = be->allocate(static_cast<size_t>(n) * 4);
  const Tensor ta(da.data(), DType::f32, {n}, Device::cuda), tb(db.data(), DType::f32, {n}, Device::cuda),
      tc(dc.data(), DType::f32, {n}, Device::cuda);
  be->copy(Tensor(const_cast<float*>(a.data()), DType::f32, {n}), ta);
  be->copy(Tensor(const_cast<float*>(b.data()), DType::f32, {n}), tb);
  const uint64_t before = be->fence();
  be->wait_for(before);
  Buffer staging = be->allocate_staging(static_cast<size_t>(n) * 4);
  EXPECT_EQ(staging.device(), Device::cpu);
  const Tensor host(staging.data(), DType::f32, {n});
  be->add(ta, tb, tc);
  be->copy_to_staging(tc, host);
  be->wait_for(be->fence());
  std::vector<float> want(static_cast<size_t>(n));
  for (size_t i = 0; i < want.size(); ++i) want[i] = a[i] + b[i];
  EXPECT_EQ(std::vector<float>(host.ptr<float>(), host.ptr<float>() + n), want);
  EXPECT_THROW(be->copy_to_staging(tc, ta), Error);  // the destination must be host memory
}

TEST(GpuMemory, NameSaysCuda) {
  SPECDEC_REQUIRE_GPU();
  BackendOptions o;
  o.device = Device::cuda;
  auto be = make_backend(o);
  EXPECT_EQ(be->device(), Device::cuda);
  EXPECT_EQ(be->name().rfind("cuda", 0), 0u) << be->name();
}

}  // namespace
}  // namespace specdec::gpu_test
