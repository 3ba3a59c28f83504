// argmax against its definition (first maximum wins; a row holding a NaN is an error, never a
// token) on rows with ties, NaN, infinities and signed zeros; and greedy sample() without
// processors against the argmax of probabilities(), the path it short-cuts.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "sampling/sampling.h"

namespace specdec {
namespace {

// -1 for a row with a NaN, where argmax must throw.
int32_t argmax_definition(const std::vector<float>& v) {
  for (float x : v)
    if (std::isnan(x)) return -1;
  size_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[best]) best = i;
  return static_cast<int32_t>(best);
}

TEST(Argmax, MatchesDefinitionOnAwkwardRows) {
  std::mt19937 rng(3);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> specials = {nan, inf, -inf, 0.0f, -0.0f, 1.0f, 1.0f};
  for (size_t n : {1, 2, 15, 16, 17, 33, 100, 8192}) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> v(n);
      // Few distinct values, so ties and specials are common.
      for (float& x : v) x = (rng() % 4 == 0) ? specials[rng() % specials.size()] : static_cast<float>(rng() % 5);
      if (argmax_definition(v) < 0) {
        ASSERT_THROW(argmax(v), Error) << "n=" << n << " trial " << trial;
      } else {
        ASSERT_EQ(argmax(v), argmax_definition(v)) << "n=" << n << " trial " << trial;
      }
    }
  }
  EXPECT_THROW(argmax(std::vector<float>{nan, 5.0f, 7.0f}), Error);
  EXPECT_EQ(argmax(std::vector<float>{-inf, -inf}), 0);
  EXPECT_EQ(argmax(std::vector<float>{-0.0f, 0.0f}), 0);
  EXPECT_THROW(argmax(std::vector<float>{1.0f, nan, 2.0f, 2.0f}), Error);
  std::vector<float> late(8192, 1.0f);
  late[8190] = nan;  // past the vectorised body's lanes too
  EXPECT_THROW(argmax(late), Error);
}

TEST(Argmax, GreedySampleEqualsArgmaxOfProbabilities) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.top_k = 5;  // filters never move the argmax; greedy skips them
  const std::vector<int32_t> prompt = {1, 2, 3};
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> logits(8192);
    for (float& l : logits) l = std::round(normal(rng));  // rounded: many ties at the top
    const std::vector<float> p = probabilities(logits, greedy, prompt, {});
    EXPECT_EQ(sample(logits, greedy, prompt, {}, static_cast<uint64_t>(trial)), argmax(p)) << "trial " << trial;
    EXPECT_EQ(sample(logits, greedy, prompt, {}, 0), argmax_definition(logits)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace specdec
