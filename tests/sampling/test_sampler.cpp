// The sampler keyed by (seed, position): a pure function of its inputs, inverse-CDF over the
// final distribution in token-id order, and its frequencies converge to softmax(logits / T).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "sampling/philox.h"
#include "sampling/sampling.h"

namespace specdec {
namespace {

std::vector<float> random_logits(uint64_t seed, size_t vocab, float scale) {
  std::vector<float> out(vocab);
  for (size_t i = 0; i < vocab; ++i) out[i] = scale * (uniform01(seed, i, 9) - 0.5f);
  return out;
}

// Pearson's chi-square of observed counts against expected probabilities.
double chi_square(const std::vector<int>& counts, const std::vector<double>& expected, int n) {
  double chi = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = expected[i] * n;
    if (e == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0 but was drawn";
      continue;
    }
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

TEST(Sampler, IsAPureFunctionOfItsInputs) {
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_p = 0.95f;
  params.seed = 1234;
  const std::vector<float> logits = random_logits(1, 64, 8.0f);
  const std::vector<int32_t> prompt{3, 4, 5}, generated{7, 7};
  std::vector<int32_t> forward, backward(200);
  for (uint64_t pos = 0; pos < 200; ++pos)
    forward.push_back(sample(logits, params, prompt, generated, pos));
  for (uint64_t pos = 200; pos-- > 0;)
    backward[pos] = sample(logits, params, prompt, generated, pos);
  EXPECT_EQ(forward, backward);  // no hidden state carried between calls
  // Other work in between (another request, another seed) changes nothing.
  SamplingParams other = params;
  other.seed = 99;
  for (uint64_t pos = 0; pos < 200; ++pos) {
    (void)sample(random_logits(pos, 64, 3.0f), other, {}, {}, pos);
    ASSERT_EQ(sample(logits, params, prompt, generated, pos), forward[pos]);
  }
  // The draw at a position is the inverse CDF of the final distribution at uniform01(seed, pos).
  const std::vector<float> p = probabilities(logits, params, prompt, generated);
  for (uint64_t pos = 0; pos < 200; ++pos) {
    const double u = uniform01(params.seed, pos);
    double cum = 0;
    int32_t expect = -1;
    for (size_t i = 0; i < p.size() && expect < 0; ++i) {
      cum += p[i];
      if (p[i] > 0 && cum > u) expect = static_cast<int32_t>(i);
    }
    ASSERT_EQ(forward[pos], expect) << "position " << pos;
  }
}

TEST(Sampler, SeedAndPositionBothMatter) {
  SamplingParams params;
  const std::vector<float> logits(32, 0.0f);  // uniform: every draw is informative
  int differ_by_position = 0, differ_by_seed = 0;
  for (uint64_t pos = 0; pos < 100; ++pos) {
    params.seed = 1;
    const int32_t a = sample(logits, params, {}, {}, pos);
    const int32_t b = sample(logits, params, {}, {}, pos + 1);
    params.seed = 2;
    const int32_t c = sample(logits, params, {}, {}, pos);
    differ_by_position += a != b;
    differ_by_seed += a != c;
  }
  EXPECT_GT(differ_by_position, 80);
  EXPECT_GT(differ_by_seed, 80);
}

TEST(Sampler, FrequenciesConvergeToTemperedSoftmax) {
  const std::vector<float> logits{1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -2.0f, 1.5f, 0.7f};
  for (float temperature : {1.0f, 0.7f, 1.6f}) {
    SamplingParams params;
    params.temperature = temperature;
    params.seed = 2026;
    double z = 0;
    std::vector<double> expected;
    for (float l : logits) expected.push_back(std::exp(l / temperature)), z += expected.back();
    for (double& e : expected) e /= z;
    const int n = 20000;
    std::vector<int> counts(logits.size(), 0);
    for (int pos = 0; pos < n; ++pos)
      ++counts[static_cast<size_t>(sample(logits, params, {}, {}, static_cast<uint64_t>(pos)))];
    // 7 degrees of freedom: P(chi2 > 24.3) = 0.001.
    EXPECT_LT(chi_square(counts, expected, n), 24.3) << "temperature " << temperature;
  }
}

TEST(Sampler, FilteredFrequenciesConvergeToRenormalisedDistribution) {
  SamplingParams params;
  params.top_k = 4;
  params.top_p = 0.85f;
  params.seed = 5;
  const std::vector<float> logits{1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -2.0f, 1.5f, 0.7f};
  // By hand: top-4 = {3, 6, 0, 7} with renormalised masses 0.445, 0.270, 0.164, 0.121; the mass
  // before token 7 is 0.879 >= 0.85, so top_p drops it and keeps {3, 6, 0}.
  std::vector<double> expected(logits.size(), 0.0);
  double z = 0;
  for (size_t t : {3u, 6u, 0u}) z += std::exp(logits[t]);
  for (size_t t : {3u, 6u, 0u}) expected[t] = std::exp(logits[t]) / z;
  const std::vector<float> p = probabilities(logits, params, {}, {});
  for (size_t t = 0; t < logits.size(); ++t) EXPECT_NEAR(p[t], expected[t], 1e-6) << t;
  const int n = 20000;
  std::vector<int> counts(logits.size(), 0);
  for (int pos = 0; pos < n; ++pos)
    ++counts[static_cast<size_t>(sample(logits, params, {}, {}, static_cast<uint64_t>(pos)))];
  EXPECT_LT(chi_square(counts, expected, n), 13.8);  // 2 degrees of freedom, P = 0.001
}

TEST(Sampler, GreedyIgnoresSeedAndPosition) {
  SamplingParams params;
  params.temperature = 0.0f;
  const std::vector<float> logits = random_logits(3, 50, 4.0f);
  const int32_t best = argmax(logits);
  for (uint64_t pos = 0; pos < 20; ++pos) {
    params.seed = pos * 77;
    EXPECT_EQ(sample(logits, params, {}, {}, pos), best);
  }
}

}  // namespace
}  // namespace specdec
