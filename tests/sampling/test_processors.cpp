// Each logits-processor stage against hand-computed results on vocabularies of 3-6 tokens, the
// order of the pipeline, and the parameter checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "core/error.h"
#include "sampling/sampling.h"

namespace specdec {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> logs(std::vector<float> probs) {
  for (float& p : probs) p = std::log(p);
  return probs;
}

// Which tokens a filter kept (finite logits).
std::vector<int> kept(const std::vector<float>& logits) {
  std::vector<int> out;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) out.push_back(static_cast<int>(i));
  }
  return out;
}

TEST(Processors, RepetitionPenaltyDividesPositiveMultipliesNegativeOncePerToken) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  std::vector<float> logits{2.0f, -2.0f, 1.0f, 0.5f, 0.0f};
  const std::vector<int32_t> prompt{0, 4}, generated{1, 1};
  LogitsProcessor(params).apply_penalties(logits, {prompt, generated});
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.0f, 1.0f, 0.5f, 0.0f}));
}

TEST(Processors, PresenceAndFrequencyCountGeneratedTokensOnly) {
  SamplingParams params;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  std::vector<float> logits{1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<int32_t> prompt{0, 0}, generated{2, 3, 2};
  LogitsProcessor(params).apply_penalties(logits, {prompt, generated});
  // token 2: 1 - 0.5 - 2 * 0.25; token 3: 1 - 0.5 - 0.25; token 0 is only in the prompt.
  EXPECT_EQ(logits, (std::vector<float>{1.0f, 1.0f, 0.0f, 0.25f}));
}

// Long histories on a larger vocabulary against counts kept in a map, call after call: nothing
// one call counted may remain for the next (another history, a smaller vocabulary).
TEST(Processors, PenaltiesReadEachCallsHistoryAlone) {
  SamplingParams params;
  params.repetition_penalty = 1.3f;
  params.presence_penalty = 0.4f;
  params.frequency_penalty = 0.2f;
  uint32_t state = 7;
  const auto next = [&state](uint32_t n) {
    state = state * 1664525u + 1013904223u;
    return static_cast<int32_t>((state >> 8) % n);
  };
  for (size_t vocab : {5000u, 300u, 5000u}) {
    std::vector<int32_t> prompt(900), generated(400);
    for (int32_t& t : prompt) t = next(static_cast<uint32_t>(vocab));
    for (int32_t& t : generated) t = next(static_cast<uint32_t>(vocab / 3));  // many repeats
    std::vector<float> logits(vocab), expect(vocab);
    for (size_t i = 0; i < vocab; ++i) logits[i] = expect[i] = 0.01f * static_cast<float>(next(600)) - 3.0f;
    std::map<int32_t, int> in_history, in_generated;
    for (int32_t t : prompt) ++in_history[t];
    for (int32_t t : generated) ++in_history[t], ++in_generated[t];
    for (const auto& [t, n] : in_history) {
      float& l = expect[static_cast<size_t>(t)];
      l = l < 0.0f ? l * 1.3f : l / 1.3f;
    }
    for (const auto& [t, n] : in_generated) expect[static_cast<size_t>(t)] -= 0.4f + 0.2f * static_cast<float>(n);
    LogitsProcessor(params).apply_penalties(logits, {prompt, generated});
    EXPECT_EQ(logits, expect) << "vocabulary " << vocab;
  }
}

TEST(Processors, NegativePresencePenaltyEncouragesRepeats) {
  SamplingParams params;
  params.presence_penalty = -1.0f;
  std::vector<float> logits{0.0f, 0.0f};
  const std::vector<int32_t> generated{1};
  LogitsProcessor(params).apply_penalties(logits, {{}, generated});
  EXPECT_EQ(logits, (std::vector<float>{0.0f, 1.0f}));
}

TEST(Processors, LogitBiasAdds) {
  SamplingParams params;
  params.logit_bias = {{1, 3.0f}, {3, -100.0f}, {1, 0.5f}};
  std::vector<float> logits{1.0f, 1.0f, 1.0f, 1.0f};
  LogitsProcessor(params).apply_logit_bias(logits);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, 4.5f, 1.0f, -99.0f}));
}

TEST(Processors, TemperatureDivides) {
  SamplingParams params;
  params.temperature = 0.5f;
  std::vector<float> logits{1.0f, 2.0f, -3.0f};
  LogitsProcessor(params).apply_temperature(logits);
  EXPECT_EQ(logits, (std::vector<float>{2.0f, 4.0f, -6.0f}));
}

TEST(Processors, TopKKeepsTiesWithTheKthValue) {
  SamplingParams params;
  params.top_k = 2;
  std::vector<float> a{1.0f, 3.0f, 3.0f, 2.0f, 0.0f};
  LogitsProcessor(params).apply_top_k(a);
  EXPECT_EQ(kept(a), (std::vector<int>{1, 2}));
  EXPECT_EQ(a[1], 3.0f);  // survivors are untouched

  params.top_k = 3;
  std::vector<float> b{1.0f, 3.0f, 3.0f, 2.0f, 0.0f};
  LogitsProcessor(params).apply_top_k(b);
  EXPECT_EQ(kept(b), (std::vector<int>{1, 2, 3}));

  params.top_k = 2;
  std::vector<float> c{1.0f, 2.0f, 2.0f, 2.0f};
  LogitsProcessor(params).apply_top_k(c);
  EXPECT_EQ(kept(c), (std::vector<int>{1, 2, 3}));

  params.top_k = 10;  // larger than the vocabulary: no-op
  std::vector<float> d{1.0f, 2.0f};
  LogitsProcessor(params).apply_top_k(d);
  EXPECT_EQ(kept(d), (std::vector<int>{0, 1}));
}

TEST(Processors, TopPKeepsSmallestSetReachingTheMass) {
  SamplingParams params;
  const std::vector<float> probs{0.05f, 0.5f, 0.15f, 0.3f};
  auto run = [&](float top_p) {
    params.top_p = top_p;
    std::vector<float> l = logs(probs);
    LogitsProcessor(params).apply_top_p(l);
    return kept(l);
  };
  EXPECT_EQ(run(0.4f), (std::vector<int>{1}));
  EXPECT_EQ(run(0.75f), (std::vector<int>{1, 3}));
  EXPECT_EQ(run(0.9f), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(run(0.99f), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(run(0.01f), (std::vector<int>{1}));  // never empty
}

TEST(Processors, TopPBreaksProbabilityTiesByTokenId) {
  SamplingParams params;
  params.top_p = 0.6f;
  std::vector<float> l{0.0f, 0.0f, 0.0f, 0.0f};
  LogitsProcessor(params).apply_top_p(l);
  EXPECT_EQ(kept(l), (std::vector<int>{0, 1, 2}));
}

TEST(Processors, TopPOnLargeVocabularyMatchesAFullSort) {
  // Flat and peaked rows of 5000 tokens with repeated values: the boundary falls anywhere from
  // the first few tokens to thousands deep. Reference: sort everything by (p desc, id asc).
  for (float spread : {0.5f, 4.0f, 20.0f}) {
    for (float top_p : {0.1f, 0.5f, 0.9f, 0.999f}) {
      std::vector<float> logits(5000);
      for (size_t i = 0; i < logits.size(); ++i) {
        logits[i] = std::round(spread * std::sin(static_cast<float>(i * i % 977)) * 8) / 8;
      }
      std::vector<double> p(logits.size());
      double z = 0;
      const float max = *std::max_element(logits.begin(), logits.end());
      for (size_t i = 0; i < p.size(); ++i)
        z += p[i] = std::exp(static_cast<double>(logits[i] - max));
      std::vector<int> order(p.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
      std::sort(order.begin(), order.end(), [&](int a, int b) {
        return logits[static_cast<size_t>(a)] != logits[static_cast<size_t>(b)]
                   ? logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]
                   : a < b;
      });
      std::vector<int> expect;
      double before = 0;
      for (int t : order) {
        if (before >= top_p) break;
        expect.push_back(t);
        before += p[static_cast<size_t>(t)] / z;
      }
      std::sort(expect.begin(), expect.end());
      SamplingParams params;
      params.top_p = top_p;
      LogitsProcessor(params).apply_top_p(logits);
      const std::vector<int> got = kept(logits);
      // Masses summed in float vs double may disagree only for a token sitting on the boundary.
      EXPECT_LE(std::abs(static_cast<long>(got.size()) - static_cast<long>(expect.size())), 1)
          << "spread " << spread << " top_p " << top_p;
      const size_t common = std::min(got.size(), expect.size());
      EXPECT_TRUE(std::includes(got.begin(), got.end(), expect.begin(), expect.end()) ||
                  std::includes(expect.begin(), expect.end(), got.begin(), got.end()));
      EXPECT_GT(common, 0u);
    }
  }
}

TEST(Processors, MinPKeepsTokensAboveFractionOfTheTop) {
  SamplingParams params;
  params.min_p = 0.2f;  // threshold 0.2 * 0.5 = 0.1
  std::vector<float> l = logs({0.5f, 0.3f, 0.15f, 0.05f});
  LogitsProcessor(params).apply_min_p(l);
  EXPECT_EQ(kept(l), (std::vector<int>{0, 1, 2}));

  params.min_p = 1.0f;  // only the top (and its ties)
  std::vector<float> m{1.0f, 2.0f, 2.0f, 0.0f};
  LogitsProcessor(params).apply_min_p(m);
  EXPECT_EQ(kept(m), (std::vector<int>{1, 2}));
}

TEST(Processors, BiasComesBeforeTemperature) {
  SamplingParams params;
  params.temperature = 0.5f;
  params.logit_bias = {{1, 1.0f}};
  const std::vector<float> logits{0.0f, 0.0f};
  const std::vector<float> p = probabilities(logits, params, {}, {});
  // (0 + 1) / 0.5 = 2, not 0 / 0.5 + 1 = 1.
  EXPECT_NEAR(p[1], 1.0 / (1.0 + std::exp(-2.0)), 1e-6);
}

TEST(Processors, PenaltiesComeBeforeTopK) {
  SamplingParams params;
  params.repetition_penalty = 4.0f;
  params.top_k = 1;
  const std::vector<float> logits{3.0f, 2.0f, 1.0f};
  const std::vector<int32_t> generated{0};
  const std::vector<float> p = probabilities(logits, params, {}, generated);
  EXPECT_EQ(p, (std::vector<float>{0.0f, 1.0f, 0.0f}));  // 3 / 4 < 2
}

TEST(Processors, TopKThenTopPThenMinPRenormalise) {
  SamplingParams params;
  params.top_k = 3;     // drops token 4 (0.04)
  params.top_p = 0.8f;  // of {0.4, 0.3, 0.26}/0.96: 0.417 + 0.3125 < 0.8, so all three stay
  params.min_p = 0.7f;  // threshold 0.7 * 0.417: drops token 2 (0.271)
  const std::vector<float> logits = logs({0.4f, 0.3f, 0.26f, 0.0001f, 0.04f});
  const std::vector<float> p = probabilities(logits, params, {}, {});
  EXPECT_NEAR(p[0], 0.4 / 0.7, 1e-6);
  EXPECT_NEAR(p[1], 0.3 / 0.7, 1e-6);
  EXPECT_EQ(p[2], 0.0f);
  EXPECT_EQ(p[3], 0.0f);
  EXPECT_EQ(p[4], 0.0f);
}

TEST(Processors, ProbabilitiesAreSoftmaxOfScaledLogits) {
  SamplingParams params;
  params.temperature = 0.7f;
  const std::vector<float> logits{0.1f, -1.0f, 2.0f, 0.5f};
  const std::vector<float> p = probabilities(logits, params, {}, {});
  double z = 0;
  for (float l : logits) z += std::exp(l / 0.7);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(p[i], std::exp(logits[i] / 0.7) / z, 1e-6);
}

TEST(Processors, GreedyIsOneHotAtPenalisedArgmaxLowestIdOnTies) {
  SamplingParams params;
  params.temperature = 0.0f;
  const std::vector<float> tie{1.0f, 5.0f, 5.0f, 2.0f};
  EXPECT_EQ(probabilities(tie, params, {}, {}), (std::vector<float>{0, 1, 0, 0}));
  EXPECT_EQ(sample(tie, params, {}, {}, 0), 1);
  EXPECT_EQ(argmax(tie), 1);

  params.logit_bias = {{3, 4.0f}};
  EXPECT_EQ(sample(tie, params, {}, {}, 0), 3);
  params.logit_bias.clear();
  params.frequency_penalty = 1.0f;
  const std::vector<int32_t> generated{1};
  EXPECT_EQ(sample(tie, params, {}, generated, 0), 2);
}

TEST(Processors, SampleFromWeightsWalksTokenIdOrder) {
  const std::vector<float> w{0.0f, 1.0f, 0.0f, 3.0f, 0.0f};
  EXPECT_EQ(sample_from_weights(w, 0.0f), 1);
  EXPECT_EQ(sample_from_weights(w, 0.2499f), 1);
  EXPECT_EQ(sample_from_weights(w, 0.25f), 3);
  EXPECT_EQ(sample_from_weights(w, 0.99999994f), 3);
  const std::vector<float> one{0.0f, 0.0f, 1e-30f, 0.0f};
  EXPECT_EQ(sample_from_weights(one, 0.99999994f), 2);  // never a zero-weight token
  const std::vector<float> none{0.0f, 0.0f};
  EXPECT_THROW(sample_from_weights(none, 0.5f), Error);
}

TEST(Processors, ValidateNamesTheField) {
  auto message = [](auto mutate) {
    SamplingParams params;
    mutate(params);
    try {
      params.validate(100);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("ok");
  };
  EXPECT_EQ(message([](SamplingParams&) {}), "ok");
  EXPECT_NE(message([](SamplingParams& p) { p.temperature = -1; }).find("temperature"),
            std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.temperature = kInf; }).find("temperature"),
            std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.top_k = -1; }).find("top_k"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.top_p = 0; }).find("top_p"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.top_p = 1.5f; }).find("top_p"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.min_p = -0.1f; }).find("min_p"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.repetition_penalty = 0; }).find("repetition_penalty"),
            std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.presence_penalty = 3; }).find("presence_penalty"),
            std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) { p.frequency_penalty = NAN; }).find("frequency_penalty"),
            std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) {
              p.logit_bias = {{100, 1.0f}};
            }).find("logit_bias token 100"),
            std::string::npos);
  EXPECT_NE(message([](SamplingParams& p) {
              p.logit_bias = {{1, 101.0f}};
            }).find("logit_bias"),
            std::string::npos);
  SamplingParams bad;
  bad.top_p = 2;
  EXPECT_THROW(LogitsProcessor{bad}, Error);
}

TEST(Processors, RejectsBadRows) {
  SamplingParams params;
  const std::vector<float> logits{0.0f, 1.0f};
  const std::vector<int32_t> outside{2};
  // History is only read (and so only checked) when a penalty uses it.
  EXPECT_NO_THROW(sample(logits, params, outside, {}, 0));
  SamplingParams penalised;
  penalised.repetition_penalty = 1.1f;
  EXPECT_THROW(sample(logits, penalised, outside, {}, 0), Error);
  penalised = SamplingParams{};
  penalised.presence_penalty = 0.1f;
  EXPECT_THROW(sample(logits, penalised, {}, outside, 0), Error);
  EXPECT_THROW(sample({}, params, {}, {}, 0), Error);
  const std::vector<float> dead{-kInf, -kInf};
  EXPECT_THROW(sample(dead, params, {}, {}, 0), Error);
  const std::vector<float> nan{0.0f, NAN};
  EXPECT_THROW(sample(nan, params, {}, {}, 0), Error);
  params.logit_bias = {{5, 1.0f}};
  EXPECT_THROW(sample(logits, params, {}, {}, 0), Error);
}

}  // namespace
}  // namespace specdec
