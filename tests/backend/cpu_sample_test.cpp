// Backend::sample on the CPU backend: exactly specdec::sample for every row of one call (the grid
// of temperatures and filters, logits of every shape, seeds and positions per row), on one or
// several threads; greedy rows equal the argmax; the errors of sample() come through.
#include <limits>
#include <set>

#include "backend/cpu_test_util.h"
#include "sampling/sampling.h"
#include "sampling_reference.h"

namespace specdec::test {
namespace {

using specdec::testing::kLogitShapes;
using specdec::testing::sampling_grid;
using specdec::testing::shaped_logits;

struct Call {
  HostTensor logits, rows, out;
  std::vector<SampleRow> params;
  int64_t V;
  Call(int64_t n, int64_t V)
      : logits(DType::f32, {n, V}), rows(DType::i32, {n, kSampleRowWords}), out(DType::i32, {n}), V(V) {}
  std::span<const float> row(size_t r) const {
    return {logits.f() + static_cast<int64_t>(r) * V, static_cast<size_t>(V)};
  }
};

// Every grid row against logits of every shape, all in one call.
Call grid_call(int64_t V, uint32_t seed) {
  const std::vector<SampleRow> grid = sampling_grid(seed);
  const int64_t n = static_cast<int64_t>(grid.size() * std::size(kLogitShapes));
  Call call(n, V);
  size_t r = 0;
  for (auto shape : kLogitShapes) {
    for (const SampleRow& p : grid) {
      const std::vector<float> l = shaped_logits(shape, static_cast<size_t>(V), seed * 1000 + static_cast<uint32_t>(r));
      std::copy(l.begin(), l.end(), call.logits.f() + static_cast<int64_t>(r) * V);
      call.params.push_back(p);
      ++r;
    }
  }
  std::memcpy(call.rows.i(), call.params.data(), call.params.size() * sizeof(SampleRow));
  return call;
}

TEST(CpuSample, EveryRowIsWhatTheHostSamplerDraws) {
  for (int64_t V : {97, 1000, 32000}) {
    Call call = grid_call(V, static_cast<uint32_t>(V));
    for (size_t threads : {1, 2}) {
      auto backend = make_cpu("", threads);
      std::fill(call.out.i(), call.out.i() + call.out.numel(), -7);
      backend->sample(call.logits.t, call.rows.t, call.out.t);
      for (size_t r = 0; r < call.params.size(); ++r) {
        ASSERT_EQ(call.out.i()[r], sample(call.row(r), call.params[r]))
            << "V " << V << " row " << r << " T " << call.params[r].temperature << " threads " << threads;
      }
    }
  }
}

TEST(CpuSample, KeysAndParamsAreReadPerRow) {
  // The same logits in every row: the tokens follow each row's own position, and greedy rows
  // give the argmax whatever their key.
  const int64_t V = 500, n = 64;
  Call call(n, V);
  const std::vector<float> l = shaped_logits(specdec::testing::LogitShape::flat, V, 3);
  for (int64_t r = 0; r < n; ++r) {
    std::copy(l.begin(), l.end(), call.logits.f() + r * V);
    call.params.push_back(SampleRow{r % 4 == 0 ? 0.0f : 1.0f, 0, 1.0f, 0.0f, 99, static_cast<uint64_t>(r)});
  }
  std::memcpy(call.rows.i(), call.params.data(), call.params.size() * sizeof(SampleRow));
  make_cpu("", 2)->sample(call.logits.t, call.rows.t, call.out.t);
  std::set<int32_t> drawn;
  for (int64_t r = 0; r < n; ++r) {
    const auto i = static_cast<size_t>(r);
    EXPECT_EQ(call.out.i()[r], sample(call.row(i), call.params[i])) << r;
    if (r % 4 == 0) {
      EXPECT_EQ(call.out.i()[r], std::max_element(l.begin(), l.end()) - l.begin());
    } else {
      drawn.insert(call.out.i()[r]);
    }
  }
  EXPECT_GT(drawn.size(), 20u);  // near-uniform logits: 48 draws at different positions spread out
}

TEST(CpuSample, RefusesWhatTheHostSamplerRefuses) {
  auto backend = make_cpu("", 1);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Call call(1, 4);
  const SampleRow sampled{0.8f, 0, 1.0f, 0.0f, 1, 2};
  std::memcpy(call.rows.i(), &sampled, sizeof(sampled));
  for (const std::vector<float>& l : {std::vector<float>{1, nan, 2, 3}, std::vector<float>{-inf, -inf, -inf, -inf},
                                      std::vector<float>{1, inf, 2, 3}}) {
    std::copy(l.begin(), l.end(), call.logits.f());
    EXPECT_THROW(backend->sample(call.logits.t, call.rows.t, call.out.t), Error);
  }
  const SampleRow bad{0.8f, 0, 1.5f, 0.0f, 1, 2};  // top_p outside (0, 1]
  std::memcpy(call.rows.i(), &bad, sizeof(bad));
  std::fill(call.logits.f(), call.logits.f() + 4, 1.0f);
  EXPECT_THROW(backend->sample(call.logits.t, call.rows.t, call.out.t), Error);
  HostTensor short_rows(DType::i32, {1, kSampleRowWords - 1});
  EXPECT_THROW(backend->sample(call.logits.t, short_rows.t, call.out.t), Error);
}

}  // namespace
}  // namespace specdec::test
