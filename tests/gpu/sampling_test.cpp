// Backend::sample on the CUDA backend against the host sampler (specdec::sample) on the same
// logits: greedy and T in {0.5, 1, 1.5} with top-k, top-p, min-p and their combinations, logits
// of several shapes, V from 7 to 128256, many rows in one call. The device computes the host's
// weights and integer masses, so every row draws the host's token. Also: batch invariance
// and determinism (also across the several launches of a call with many rows), the distribution
// of many draws against probabilities(), the rows the host refuses, and a recorded call reading
// rows written before its replay.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "gpu/gpu_test_util.h"
#include "sampling/sampling.h"
#include "sampling_reference.h"
#include "test_device.h"

namespace specdec::gpu_test {
namespace {

using specdec::testing::LogitShape;

struct Batch {
  size_t V = 0;
  std::vector<float> logits;
  std::vector<SampleRow> rows;
  std::vector<LogitShape> shapes;
  size_t size() const { return rows.size(); }
  std::span<const float> row(size_t r) const { return std::span<const float>(logits).subspan(r * V, V); }
};

// The grid against every logits shape, `copies` times with other seeds and positions.
Batch grid_batch(size_t V, int copies) {
  Batch b;
  b.V = V;
  for (int c = 0; c < copies; ++c) {
    const std::vector<SampleRow> grid = specdec::testing::sampling_grid(static_cast<uint64_t>(V) * 16 + c);
    for (LogitShape shape : specdec::testing::kLogitShapes) {
      for (const SampleRow& p : grid) {
        const auto seed = static_cast<uint32_t>(V * 131 + b.rows.size());
        const std::vector<float> l = specdec::testing::shaped_logits(shape, V, seed);
        b.logits.insert(b.logits.end(), l.begin(), l.end());
        b.rows.push_back(p);
        b.shapes.push_back(shape);
      }
    }
  }
  return b;
}

std::vector<int32_t> device_sample(Backend& g, std::span<const float> logits, std::span<const SampleRow> rows,
                                   size_t V) {
  const auto n = static_cast<int64_t>(rows.size());
  Owned l = upload_bytes(g, logits.data(), DType::f32, {n, static_cast<int64_t>(V)});
  Owned r = upload_bytes(g, rows.data(), DType::i32, {n, kSampleRowWords});
  Owned o = empty(g, DType::i32, {n});
  g.sample(l.tensor, r.tensor, o.tensor);
  return download_i32(g, o.tensor);
}

std::vector<int32_t> device_sample(Backend& g, const Batch& b) { return device_sample(g, b.logits, b.rows, b.V); }

TEST(GpuSample, DrawsTheHostSamplersTokenOnEveryRow) {
  SPECDEC_REQUIRE_GPU();
  // Rows of 2,048 logits or more are drawn by a cluster of blocks, each holding a part of the
  // row (2,049 and 4,099: a last part shorter than the others); both kernels are checked.
  const std::vector<std::pair<size_t, int>> sizes = {{7, 8},    {97, 8},    {1000, 4},  {2049, 4},
                                                     {4099, 2}, {32000, 2}, {128256, 1}};
  for (const bool cluster : {true, false}) {
    CudaTuning tuning;
    tuning.cluster_sampling = cluster;
    const std::unique_ptr<Backend> gpu = make_gpu(tuning);
    for (const auto& [V, copies] : sizes) {
      const Batch batch = grid_batch(V, copies);
      const std::vector<int32_t> got = device_sample(*gpu, batch);
      for (size_t r = 0; r < batch.size(); ++r) {
        const SampleRow& p = batch.rows[r];
        EXPECT_EQ(got[r], sample(batch.row(r), p))
            << "cluster " << cluster << " V " << V << " row " << r << " (T " << p.temperature << ", top_k " << p.top_k
            << ", top_p " << p.top_p << ", min_p " << p.min_p << ", shape " << static_cast<int>(batch.shapes[r]) << ")";
      }
    }
  }
}

TEST(GpuSample, BatchInvariantAndDeterministic) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends();
  for (size_t V : {32000, 128256}) {
    const Batch batch = grid_batch(V, 1);
    const std::vector<int32_t> all = device_sample(*b.gpu, batch);
    EXPECT_EQ(device_sample(*b.gpu, batch), all) << "V " << V << ": a second call";
    for (size_t r = 0; r < batch.size(); ++r) {
      const std::vector<int32_t> alone =
          device_sample(*b.gpu, batch.row(r), std::span<const SampleRow>(&batch.rows[r], 1), V);
      ASSERT_EQ(alone[0], all[r]) << "V " << V << " row " << r << " alone";
    }
    // The rows in reverse order, each beside other neighbours.
    Batch reversed = batch;
    for (size_t r = 0; r < batch.size(); ++r) {
      const size_t from = batch.size() - 1 - r;
      const std::span<const float> row = batch.row(from);
      std::copy(row.begin(), row.end(), reversed.logits.begin() + static_cast<ptrdiff_t>(r * V));
      reversed.rows[r] = batch.rows[from];
    }
    const std::vector<int32_t> back = device_sample(*b.gpu, reversed);
    for (size_t r = 0; r < batch.size(); ++r) {
      ASSERT_EQ(back[r], all[batch.size() - 1 - r]) << "V " << V << " row " << r;
    }
  }
}

// More rows of the 128K vocabulary than the sampler's work scratch holds at once (128 MiB: 261
// rows) go in several launches; each row must draw what it draws in a small call.
TEST(GpuSample, RowsBeyondOneLaunchDrawAsInSmallCalls) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends();
  const size_t V = 128256;
  const Batch batch = grid_batch(V, 2);
  ASSERT_GT(batch.size(), size_t{261});
  const std::vector<int32_t> all = device_sample(*b.gpu, batch);
  constexpr size_t kSlice = 50;
  for (size_t first = 0; first < batch.size(); first += kSlice) {
    const size_t count = std::min(kSlice, batch.size() - first);
    const std::vector<int32_t> part =
        device_sample(*b.gpu, std::span<const float>(batch.logits).subspan(first * V, count * V),
                      std::span<const SampleRow>(batch.rows).subspan(first, count), V);
    for (size_t r = 0; r < count; ++r) ASSERT_EQ(part[r], all[first + r]) << "row " << first + r;
  }
}

// Pearson's chi-square of the device's draws at n positions against probabilities(); a token of
// probability 0 must never be drawn.
void expect_distribution(Backend& g, const std::vector<float>& logits, SampleRow row, int n) {
  const size_t V = logits.size();
  std::vector<float> all;
  std::vector<SampleRow> rows;
  for (int i = 0; i < n; ++i) {
    all.insert(all.end(), logits.begin(), logits.end());
    row.position = static_cast<uint64_t>(i) * 3 + 1;
    rows.push_back(row);
  }
  const std::vector<int32_t> got = device_sample(g, all, rows, V);
  SamplingParams params;
  params.temperature = row.temperature;
  params.top_k = row.top_k;
  params.top_p = row.top_p;
  params.min_p = row.min_p;
  const std::vector<float> p = probabilities(logits, params, {}, {});
  std::vector<int> counts(V, 0);
  for (int32_t t : got) {
    ASSERT_TRUE(t >= 0 && static_cast<size_t>(t) < V) << t;
    ++counts[static_cast<size_t>(t)];
  }
  double chi = 0.0;
  int support = 0;
  for (size_t i = 0; i < V; ++i) {
    if (p[i] == 0.0f) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    ++support;
    const double e = static_cast<double>(p[i]) * n;
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  // Mean df, standard deviation sqrt(2 df): far beyond 8 of them only if the draws are wrong.
  const double df = support - 1;
  EXPECT_LT(chi, df + 8.0 * std::sqrt(2.0 * df) + 10.0) << "support " << support << ", T " << row.temperature;
  specdec::testing::report("gpu_sample_chi_square_over_df", chi / std::max(df, 1.0));
}

TEST(GpuSample, DrawsFollowTheFilteredDistribution) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends();
  const std::vector<float> logits = specdec::testing::shaped_logits(LogitShape::peaked, 64, 5);
  expect_distribution(*b.gpu, logits, SampleRow{1.0f, 0, 1.0f, 0.0f, 42, 0}, 40000);
  expect_distribution(*b.gpu, logits, SampleRow{0.7f, 20, 0.9f, 0.02f, 43, 0}, 40000);
  expect_distribution(*b.gpu, logits, SampleRow{1.5f, 0, 0.5f, 0.0f, 44, 0}, 40000);
}

// A row of 2,048 logits is drawn by a cluster of blocks, each holding a part of it. Its probable
// tokens here lie in every part (the rest at -inf, never to be drawn), so that the draws cross the
// CDF in each block and the blocks' filters must agree on the thresholds they share.
TEST(GpuSample, ClusterDrawsFollowTheFilteredDistribution) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends();
  std::vector<float> logits(2048, -std::numeric_limits<float>::infinity());
  for (int i = 0; i < 48; ++i)
    logits[static_cast<size_t>(i * 42 + 5)] = 0.4f * static_cast<float>(i % 7) - 0.3f * static_cast<float>(i % 5);
  expect_distribution(*b.gpu, logits, SampleRow{1.0f, 0, 1.0f, 0.0f, 42, 0}, 20000);
  expect_distribution(*b.gpu, logits, SampleRow{0.7f, 20, 0.9f, 0.02f, 43, 0}, 20000);
  expect_distribution(*b.gpu, logits, SampleRow{1.5f, 0, 0.5f, 0.0f, 44, 0}, 20000);
}

TEST(GpuSample, RowsTheHostRefusesGetMinusOne) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const SampleRow greedy{}, sampled{0.8f, 3, 0.9f, 0.0f, 1, 2};
  struct Case {
    std::vector<float> logits;
    SampleRow row;
    int32_t want;
  };
  const std::vector<Case> cases = {
      {{1, nan, 2, 3}, sampled, -1},      {{-inf, -inf, -inf, -inf}, sampled, -1},
      {{1, inf, 2, 3}, sampled, -1},      {{nan, 5, 7, 7}, greedy, -1},
      {{1, nan, 7, 7}, greedy, -1},       {{-inf, -inf, -inf, -inf}, greedy, 0},
      {{-0.0f, 0.0f, -1, -2}, greedy, 0}, {{-inf, -inf, 4, -inf}, sampled, 2}};
  std::vector<float> logits;
  std::vector<SampleRow> rows;
  for (const Case& c : cases) {
    logits.insert(logits.end(), c.logits.begin(), c.logits.end());
    rows.push_back(c.row);
  }
  const std::vector<int32_t> got = device_sample(*b.gpu, logits, rows, 4);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(got[i], cases[i].want) << "case " << i;
    if (cases[i].want >= 0) {
      EXPECT_EQ(got[i], sample(cases[i].logits, cases[i].row)) << "case " << i;
    }
  }
}

TEST(GpuSample, RecordedCallReadsTheRowsWrittenBeforeReplay) {
  SPECDEC_REQUIRE_GPU();
  Backends b = make_backends();
  Backend& g = *b.gpu;
  const Batch batch = grid_batch(1000, 1);
  const auto n = static_cast<int64_t>(batch.size());
  Owned l = upload_bytes(g, batch.logits.data(), DType::f32, {n, 1000});
  Owned r = upload_bytes(g, batch.rows.data(), DType::i32, {n, kSampleRowWords});
  Owned o = empty(g, DType::i32, {n});
  const auto step = [&] { g.sample(l.tensor, r.tensor, o.tensor); };
  step();
  const std::unique_ptr<RecordedCalls> recorded = g.record(step);
  ASSERT_TRUE(recorded);
  std::vector<SampleRow> moved = batch.rows;
  for (SampleRow& row : moved) row.position += 1000;  // new keys, same buffer
  Owned fresh = upload_bytes(g, moved.data(), DType::i32, {n, kSampleRowWords});
  g.copy(fresh.tensor, r.tensor);
  ASSERT_TRUE(recorded->replay());
  const std::vector<int32_t> replayed = download_i32(g, o.tensor);
  EXPECT_EQ(replayed, device_sample(g, batch.logits, moved, 1000));
  EXPECT_NE(replayed, device_sample(g, batch)) << "the new positions must change some draws";
}

}  // namespace
}  // namespace specdec::gpu_test
