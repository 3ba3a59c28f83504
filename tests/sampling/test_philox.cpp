// Philox4x32-10 against the published Random123 known-answer vectors, and the properties the
// sampler relies on: uniform01 is pure, in [0, 1), and its streams are independent draws.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "sampling/philox.h"

namespace specdec {
namespace {

TEST(Philox, KnownAnswerZeros) {
  const PhiloxCounter out = philox4x32_10({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(out, (PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
}

TEST(Philox, KnownAnswerOnes) {
  const PhiloxCounter out = philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                          {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(out, (PhiloxCounter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Philox, KnownAnswerPi) {
  const PhiloxCounter out = philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                                          {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(out, (PhiloxCounter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, EvaluatesAtCompileTime) {
  static_assert(philox4x32_10({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5u);
  static_assert(uniform01(1, 2, 3) == uniform01(1, 2, 3));
}

TEST(Philox, WordsUseSeedAsKeyAndPositionStreamAsCounter) {
  const uint64_t seed = 0x299f31d0a4093822ull;
  const uint64_t position = 0x85a308d3243f6a88ull;
  // Word 3 of the counter is 0 in philox_words, so compare against the block function directly.
  EXPECT_EQ(philox_words(seed, position, 7),
            philox4x32_10({0x243f6a88u, 0x85a308d3u, 7u, 0u}, {0xa4093822u, 0x299f31d0u}));
}

TEST(Philox, UniformIsPureAndInUnitInterval) {
  for (uint64_t pos = 0; pos < 10000; ++pos) {
    const float u = uniform01(42, pos);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_EQ(u, uniform01(42, pos));
    // 24-bit mantissa: u * 2^24 is an integer.
    const float scaled = u * 16777216.0f;
    ASSERT_EQ(scaled, std::floor(scaled));
  }
  EXPECT_EQ(word_to_unit(0xffffffffu), 16777215.0f / 16777216.0f);
  EXPECT_EQ(word_to_unit(0u), 0.0f);
}

TEST(Philox, SeedPositionAndStreamAllChangeTheDraw) {
  std::set<float> seen;
  for (uint64_t seed = 0; seed < 4; ++seed)
    for (uint64_t pos = 0; pos < 4; ++pos)
      for (uint32_t stream = 0; stream < 4; ++stream) seen.insert(uniform01(seed, pos, stream));
  EXPECT_EQ(seen.size(), 64u);
  // Positions past 2^32 reach the counter's high word instead of wrapping onto low positions.
  EXPECT_NE(uniform01(5, 1ull << 32), uniform01(5, 0));
}

TEST(Philox, MomentsMatchUniform) {
  // Mean 1/2 and variance 1/12; with n = 200k the standard error of the mean is ~6.5e-4.
  const int n = 200000;
  for (uint32_t stream = 0; stream < 3; ++stream) {
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; ++i) {
      const double u = uniform01(7, static_cast<uint64_t>(i), stream);
      sum += u;
      sum2 += u * u;
    }
    const double mean = sum / n, var = sum2 / n - mean * mean;
    EXPECT_NEAR(mean, 0.5, 0.004) << "stream " << stream;
    EXPECT_NEAR(var, 1.0 / 12.0, 0.002) << "stream " << stream;
  }
}

TEST(Philox, StreamsAreUncorrelated) {
  const int n = 100000;
  double sxy = 0, sx = 0, sy = 0, sxx = 0, syy = 0;
  for (int i = 0; i < n; ++i) {
    const double x = uniform01(3, static_cast<uint64_t>(i), 0);
    const double y = uniform01(3, static_cast<uint64_t>(i), 1);
    sx += x, sy += y, sxy += x * y, sxx += x * x, syy += y * y;
  }
  const double cov = sxy / n - (sx / n) * (sy / n);
  const double corr =
      cov / std::sqrt((sxx / n - (sx / n) * (sx / n)) * (syy / n - (sy / n) * (sy / n)));
  EXPECT_LT(std::abs(corr), 0.02);  // ~6 standard errors of 1/sqrt(n)
}

}  // namespace
}  // namespace specdec
