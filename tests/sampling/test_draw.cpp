// The host's sampled draw (sampling/draw.h): every kernel set gives the scalar definition's bits;
// the weights follow exp; the draw equals a plain re-implementation of its definition (sort, sum,
// walk) on every input, and the softmax sampler's token except within rounding of a decision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "sampling/draw.h"
#include "sampling/philox.h"
#include "sampling/sampling.h"
#include "sampling_reference.h"

namespace specdec {
namespace {

using testing::kLogitShapes;
using testing::LogitShape;
using testing::shaped_logits;

std::vector<const DrawKernels*> kernel_sets() {
  std::vector<const DrawKernels*> sets{&draw_kernels_scalar()};
  if (const DrawKernels* k = draw_kernels_avx2()) sets.push_back(k);
  if (const DrawKernels* k = draw_kernels_avx512()) sets.push_back(k);
  return sets;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(DrawKernels, EverySetGivesTheScalarBits) {
  const std::vector<const DrawKernels*> sets = kernel_sets();
  ASSERT_GE(sets.size(), 1u);
  uint32_t seed = 1;
  for (size_t n : {1u, 7u, 15u, 16u, 17u, 255u, 256u, 257u, 1000u, 8192u, 151936u}) {
    for (LogitShape shape : kLogitShapes) {
      for (float temperature : {1.0f, 0.8f, 1.7f, 0.05f}) {
        const std::vector<float> l = shaped_logits(shape, n, seed++);
        const size_t blocks = (n + kDrawBlock - 1) / kDrawBlock;
        std::vector<float> s_ref(n), s(n);
        std::vector<uint64_t> sums_ref(blocks), sums(blocks);
        bool nan_ref = true, nan = true;
        const float max_ref = sets[0]->scale(l.data(), s_ref.data(), n, temperature, &nan_ref);
        std::vector<float> e_ref = s_ref;
        const uint64_t total_ref = sets[0]->weigh(e_ref.data(), n, max_ref, sums_ref.data());
        EXPECT_FALSE(nan_ref);
        EXPECT_EQ(total_ref, std::accumulate(sums_ref.begin(), sums_ref.end(), uint64_t{0}));
        for (const DrawKernels* k : sets) {
          SCOPED_TRACE(::testing::Message()
                       << k->name << " n=" << n << " shape=" << static_cast<int>(shape) << " T=" << temperature);
          const float max = k->scale(l.data(), s.data(), n, temperature, &nan);
          EXPECT_EQ(std::memcmp(&max, &max_ref, sizeof(max)), 0);
          EXPECT_FALSE(nan);
          ASSERT_TRUE(same_bits(s, s_ref));
          ASSERT_EQ(k->weigh(s.data(), n, max, sums.data()), total_ref);
          ASSERT_TRUE(same_bits(s, e_ref));
          ASSERT_EQ(sums, sums_ref);
          std::fill(sums.begin(), sums.end(), 0);
          ASSERT_EQ(k->masses(s.data(), n, sums.data()), total_ref);
          ASSERT_EQ(sums, sums_ref);
        }
      }
    }
  }
  // A NaN anywhere, in the vector body or the tail, is reported by every set.
  for (const DrawKernels* k : sets) {
    for (size_t at : {0u, 5u, 16u, 40u}) {
      std::vector<float> l(41, 0.5f), s(41);
      l[at] = std::numeric_limits<float>::quiet_NaN();
      bool nan = false;
      (void)k->scale(l.data(), s.data(), l.size(), 0.7f, &nan);
      EXPECT_TRUE(nan) << k->name << " at " << at;
    }
  }
}

TEST(DrawWeight, FollowsExpAndNeverDecreases) {
  float previous = 0.0f;
  double worst = 0.0;
  for (int i = -2800000; i <= 0; ++i) {
    const float x = static_cast<float>(i) * 1e-5f;
    const float e = draw_weight(x);
    const double exact = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(e - exact) / exact);
    ASSERT_GE(e, previous) << "x = " << x;
    previous = e;
  }
  EXPECT_LT(worst, 3e-7);  // a few float ulps
  EXPECT_EQ(draw_weight(0.0f), 1.0f);
  EXPECT_EQ(draw_weight(-28.5f), 0.0f);
  EXPECT_EQ(draw_weight(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(draw_mass(1.0f), uint64_t{1} << kMassBits);
  EXPECT_EQ(draw_mass(0.0f), 0u);
  EXPECT_EQ(draw_mass(std::ldexp(1.0f, -41)), 0u);
  EXPECT_EQ(draw_mass(std::ldexp(1.0f, -40)), 1u);
}

// The definition in draw.h, written out plainly: weights one by one with draw_weight, top-k by
// sorting, top-p by sorting on (weight desc, id asc) and comparing masses against top_p * total
// in 128-bit arithmetic, then a walk in id order.
int32_t reference_draw(const std::vector<float>& logits, const SamplingParams& params, float u) {
  const size_t n = logits.size();
  std::vector<float> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = params.temperature == 1.0f ? logits[i] : logits[i] / params.temperature;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < n) {
    std::vector<float> sorted = s;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const float kth = sorted[static_cast<size_t>(params.top_k) - 1];
    for (float& v : s)
      if (v < kth) v = -std::numeric_limits<float>::infinity();
  }
  const float max = *std::max_element(s.begin(), s.end());
  std::vector<float> e(n);
  for (size_t i = 0; i < n; ++i) e[i] = draw_weight(s[i] - max);
  const auto total_of = [&] {
    uint64_t t = 0;
    for (float w : e) t += draw_mass(w);
    return t;
  };
  if (params.top_p < 1.0f) {
    const uint64_t total = total_of();
    // top_p * 2^64 is an integer for the fractions the tests use.
    const auto scaled = static_cast<unsigned __int128>(std::ldexp(static_cast<long double>(params.top_p), 64));
    const unsigned __int128 product = scaled * total;
    const auto need = static_cast<uint64_t>((product >> 64) + ((product & ~uint64_t{0}) != 0 ? 1 : 0));
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return e[a] > e[b]; });
    uint64_t before = 0;
    std::vector<bool> keep(n, false);
    for (size_t i : order) {
      if (before >= need || draw_mass(e[i]) == 0) break;
      keep[i] = true;
      before += draw_mass(e[i]);
    }
    for (size_t i = 0; i < n; ++i)
      if (!keep[i]) e[i] = 0.0f;
  }
  if (params.min_p > 0.0f)
    for (float& w : e)
      if (w < params.min_p) w = 0.0f;
  const uint64_t total = total_of();
  const auto target = static_cast<uint64_t>((static_cast<unsigned __int128>(u * 16777216.0f) * total) >> 24);
  uint64_t cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += draw_mass(e[i]);
    if (cum > target) return static_cast<int32_t>(i);
  }
  return -1;
}

struct Filters {
  int top_k;
  float top_p, min_p;
};
const Filters kFilters[] = {{0, 1.0f, 0.0f},   {1, 1.0f, 0.0f},  {5, 1.0f, 0.0f},   {50, 1.0f, 0.0f},
                            {700, 1.0f, 0.0f}, {0, 0.5f, 0.0f},  {0, 0.9f, 0.0f},   {0, 0.96875f, 0.0f},
                            {0, 1.0f, 0.05f},  {0, 1.0f, 0.2f},  {50, 0.9f, 0.0f},  {5, 0.5f, 0.05f},
                            {0, 0.9f, 0.2f},   {0, 0.25f, 0.0f}, {50, 0.75f, 0.05f}};

TEST(DrawSampled, IsItsDefinitionOnEveryInput) {
  uint32_t seed = 100;
  int draws = 0;
  for (size_t n : {1u, 2u, 31u, 256u, 300u, 8192u, 40000u}) {
    for (LogitShape shape : kLogitShapes) {
      const std::vector<float> l = shaped_logits(shape, n, seed++);
      for (float temperature : {0.3f, 1.0f, 1.5f}) {
        for (const Filters& f : kFilters) {
          SamplingParams params;
          params.temperature = temperature;
          params.top_k = f.top_k;
          params.top_p = f.top_p;
          params.min_p = f.min_p;
          const int positions = n > 10000 ? 3 : 12;
          for (int pos = 0; pos < positions; ++pos) {
            const float u = uniform01(seed, static_cast<uint64_t>(pos));
            ASSERT_EQ(draw_sampled(l, params, u), reference_draw(l, params, u))
                << "n=" << n << " shape=" << static_cast<int>(shape) << " T=" << temperature << " k=" << f.top_k
                << " p=" << f.top_p << " min_p=" << f.min_p << " u=" << u;
            ++draws;
          }
        }
      }
    }
  }
  // The ends of the uniform's range: the first token with any mass, and the last.
  const std::vector<float> l{-std::numeric_limits<float>::infinity(), 0.0f, 1.0f, -40.0f, 2.0f, -100.0f};
  SamplingParams params;
  params.temperature = 1.0f;
  EXPECT_EQ(draw_sampled(l, params, 0.0f), 1);
  EXPECT_EQ(draw_sampled(l, params, 1.0f - std::ldexp(1.0f, -24)), 4);
  EXPECT_GT(draws, 1000);
}

// The softmax sampler this draw replaced: the logits processor's stages, a softmax summed in
// double in id order, the inverse CDF walked in double.
int32_t softmax_draw(const std::vector<float>& logits, const SamplingParams& params, float u) {
  std::vector<float> p = logits;
  LogitsProcessor(params).apply(p, {});
  softmax_in_place(p);
  return sample_from_weights(p, u);
}

// Against the softmax sampler: the same token wherever u lies clear of a decision boundary by
// more than rounding, and the same distribution.
TEST(DrawSampled, DrawsTheSoftmaxSamplersTokenAwayFromItsBoundaries) {
  int compared = 0, near = 0;
  uint32_t seed = 7;
  for (const SampleRow& row : testing::sampling_grid(3)) {
    if (row.temperature == 0.0f) continue;
    for (LogitShape shape : kLogitShapes) {
      const std::vector<float> l = shaped_logits(shape, 5000, seed++);
      const SamplingParams params = sampling_params(row);
      const float u = uniform01(row.seed, row.position);
      const int32_t softmax_token = softmax_draw(l, params, u);
      if (testing::near_a_boundary(l, row)) {
        ++near;
        continue;
      }
      std::vector<float> softmax = l;
      LogitsProcessor(params).apply(softmax, {});
      softmax_in_place(softmax);
      const std::vector<float> p = probabilities(l, params, {}, {});
      for (size_t i = 0; i < p.size(); ++i) ASSERT_NEAR(p[i], softmax[i], 1e-6 * softmax[i] + 1e-12) << i;
      EXPECT_EQ(draw_sampled(l, params, u), softmax_token)
          << "T=" << row.temperature << " k=" << row.top_k << " p=" << row.top_p << " min_p=" << row.min_p;
      ++compared;
    }
  }
  // The all-equal and tied shapes put many draws on a boundary; the rest are compared.
  EXPECT_GT(compared, 120);
  EXPECT_LT(near, compared / 2);
}

// A token's logprob, its rank and the most likely tokens against a reference in double
// precision over a full sort: rows with ties, masked tokens, and penalties that change the logits.
TEST(TokenLogprobs, MatchALogSoftmaxInDoubleAndAFullSort) {
  uint32_t seed = 300;
  for (size_t n : {1u, 40u, 5000u, 70000u}) {
    for (LogitShape shape : kLogitShapes) {
      const std::vector<float> l = shaped_logits(shape, n, seed++);
      for (bool penalised : {false, true}) {
        SamplingParams params;
        params.temperature = 0.7f;  // logprobs are taken before temperature: it changes nothing
        std::vector<int32_t> generated;
        if (penalised) {
          params.repetition_penalty = 1.5f;
          for (size_t i = 0; i < std::min<size_t>(n, 30); ++i)
            generated.push_back(static_cast<int32_t>((i * 7919) % n));
        }
        std::vector<float> ref = l;
        LogitsProcessor(params).apply_penalties(ref, {{}, generated});
        double max = -std::numeric_limits<double>::infinity();
        for (float v : ref) max = std::max(max, static_cast<double>(v));
        double sum = 0;
        for (float v : ref) sum += std::exp(static_cast<double>(v) - max);
        const double log_sum = max + std::log(sum);
        std::vector<int32_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
          return ref[static_cast<size_t>(a)] > ref[static_cast<size_t>(b)];
        });
        for (int32_t token : {int32_t{0}, static_cast<int32_t>(n / 2), static_cast<int32_t>(n - 1)}) {
          const int top = static_cast<int>(std::min<size_t>(n, 20));
          const TokenLogprobs got = token_logprobs(l, params, {{}, generated}, token, top);
          const float own = ref[static_cast<size_t>(token)];
          SCOPED_TRACE(::testing::Message() << "n=" << n << " shape=" << static_cast<int>(shape) << " token " << token);
          if (std::isfinite(own)) {
            EXPECT_NEAR(got.logprob, own - log_sum, 1e-5);
          }
          EXPECT_EQ(got.rank, 1 + std::count_if(ref.begin(), ref.end(), [&](float v) { return v > own; }));
          ASSERT_EQ(got.top.size(), static_cast<size_t>(top));
          for (size_t j = 0; j < got.top.size(); ++j) {
            EXPECT_EQ(got.top[j].first, order[j]) << "place " << j;
            EXPECT_NEAR(got.top[j].second, ref[static_cast<size_t>(order[j])] - log_sum, 1e-5) << "place " << j;
          }
        }
      }
    }
  }
}

TEST(DrawSampled, RefusesWhatItCannotDraw) {
  SamplingParams params;
  params.temperature = 0.8f;
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_THROW(draw_sampled(std::vector<float>{}, params, 0.5f), Error);
  EXPECT_THROW(draw_sampled(std::vector<float>{1.0f, std::nanf(""), 2.0f}, params, 0.5f), Error);
  EXPECT_THROW(draw_sampled(std::vector<float>(40, -inf), params, 0.5f), Error);
  params.temperature = 0.0f;
  EXPECT_THROW(draw_sampled(std::vector<float>{1.0f, 2.0f}, params, 0.5f), Error);
}

}  // namespace
}  // namespace specdec
