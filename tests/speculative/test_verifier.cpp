// The verifier: exact mode reproduces plain decoding token for token (any temperature, with
// penalties that read the drafts as history); rejection mode emits the target's distribution,
// checked statistically on a 6-token vocabulary; the stop cut of a burst.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "sampling/philox.h"
#include "sampling/sampling.h"
#include "speculative/verifier.h"

namespace specdec {
namespace {

constexpr size_t kVocab = 12;

// A stand-in target: logits that depend on the whole history (its length and last two tokens),
// so a verifier that fed the wrong history or position would be caught.
std::vector<float> target_logits(const std::vector<int32_t>& tokens) {
  const size_t n = tokens.size();
  const uint64_t key = (n << 16) ^ (static_cast<uint64_t>(tokens[n - 1]) << 8) ^
                       (n > 1 ? static_cast<uint64_t>(tokens[n - 2]) : 0u);
  std::vector<float> out(kVocab);
  for (size_t v = 0; v < kVocab; ++v) out[v] = 5.0f * (uniform01(key, v, 11) - 0.5f);
  return out;
}

std::vector<int32_t> plain_decode(const std::vector<int32_t>& prompt, const SamplingParams& params,
                                  size_t count) {
  std::vector<int32_t> tokens = prompt;
  while (tokens.size() < prompt.size() + count) {
    const std::span<const int32_t> all(tokens);
    const uint64_t position = tokens.size();
    tokens.push_back(sample(target_logits(tokens), params, all.first(prompt.size()),
                            all.subspan(prompt.size()), position));
  }
  return tokens;
}

// Speculative decoding of the same request: drafts copy the plain output with random errors
// (so acceptance varies), the window holds the target's logits after pending + each draft.
std::vector<int32_t> spec_decode(const std::vector<int32_t>& prompt, const SamplingParams& params,
                                 size_t count, const std::vector<int32_t>& oracle, bool rejection) {
  std::vector<int32_t> tokens = prompt;
  uint64_t round = 0;
  while (tokens.size() < prompt.size() + count) {
    const size_t k = static_cast<size_t>(uniform01(77, round, 0) * 6);  // 0..5 drafts
    std::vector<int32_t> drafts;
    for (size_t i = 0; i < k; ++i) {
      const size_t at = tokens.size() + i;
      int32_t guess = at < oracle.size() ? oracle[at] : 0;
      if (uniform01(78, round * 16 + i, 0) < 0.25f)
        guess = static_cast<int32_t>((guess + 1) % kVocab);
      drafts.push_back(guess);
    }
    std::vector<float> window;
    std::vector<int32_t> seen = tokens;
    for (size_t i = 0; i <= k; ++i) {
      const std::vector<float> row = target_logits(seen);
      window.insert(window.end(), row.begin(), row.end());
      if (i < k) seen.push_back(drafts[i]);
    }
    const std::span<const int32_t> all(tokens);
    const TokenHistory history{all.first(prompt.size()), all.subspan(prompt.size())};
    const VerifyResult r =
        rejection ? verify_rejection(window, kVocab, drafts, {}, params, history, tokens.size())
                  : verify_exact(window, kVocab, drafts, params, history, tokens.size());
    // accepted = the longest prefix of drafts the target agreed with; emitted = that + 1 token.
    EXPECT_EQ(r.emitted.size(), static_cast<size_t>(r.accepted) + 1);
    for (int i = 0; i < r.accepted; ++i)
      EXPECT_EQ(r.emitted[static_cast<size_t>(i)], drafts[static_cast<size_t>(i)]);
    if (!rejection && static_cast<size_t>(r.accepted) < k) {
      EXPECT_NE(r.emitted.back(), drafts[static_cast<size_t>(r.accepted)]);
    }
    tokens.insert(tokens.end(), r.emitted.begin(), r.emitted.end());
    ++round;
  }
  tokens.resize(prompt.size() + count);
  return tokens;
}

TEST(VerifierExact, MatchesPlainDecodingAtAnyTemperature) {
  const std::vector<int32_t> prompt{1, 2, 3, 1, 2};
  for (float temperature : {0.0f, 0.8f, 1.3f}) {
    for (uint64_t seed : {0ull, 17ull, 123456789ull}) {
      SamplingParams params;
      params.temperature = temperature;
      params.seed = seed;
      params.top_p = 0.95f;
      params.repetition_penalty = 1.3f;
      params.frequency_penalty = 0.4f;
      const std::vector<int32_t> plain = plain_decode(prompt, params, 200);
      EXPECT_EQ(spec_decode(prompt, params, 200, plain, false), plain)
          << "temperature " << temperature << " seed " << seed;
    }
  }
}

TEST(VerifierExact, AcceptedCountIsTheMatchingPrefix) {
  SamplingParams params;
  params.temperature = 0.8f;
  params.seed = 9;
  const std::vector<int32_t> prompt{4, 5};
  const std::vector<int32_t> plain = plain_decode(prompt, params, 6);
  const std::vector<int32_t> next(plain.begin() + 2, plain.end());  // the 6 plain tokens
  auto window_for = [&](const std::vector<int32_t>& drafts) {
    std::vector<float> window;
    std::vector<int32_t> seen = prompt;
    for (size_t i = 0; i <= drafts.size(); ++i) {
      const std::vector<float> row = target_logits(seen);
      window.insert(window.end(), row.begin(), row.end());
      if (i < drafts.size()) seen.push_back(drafts[i]);
    }
    return window;
  };
  const std::span<const int32_t> p(prompt);
  for (int good = 0; good <= 5; ++good) {
    std::vector<int32_t> drafts(next.begin(), next.begin() + 5);
    if (good < 5)
      drafts[static_cast<size_t>(good)] = (drafts[static_cast<size_t>(good)] + 3) % kVocab;
    const VerifyResult r = verify_exact(window_for(drafts), kVocab, drafts, params, {p, {}}, 2);
    EXPECT_EQ(r.accepted, good);
    EXPECT_EQ(r.emitted, std::vector<int32_t>(next.begin(), next.begin() + good + 1));
  }
  // No drafts: one plain step.
  const VerifyResult plain_step = verify_exact(window_for({}), kVocab, {}, params, {p, {}}, 2);
  EXPECT_EQ(plain_step.accepted, 0);
  EXPECT_EQ(plain_step.emitted, std::vector<int32_t>{next[0]});
}

TEST(VerifierExactTokens, DrawnTokensGiveWhatTheLogitsGive) {
  // verify_exact on the window rows' own tokens (as a backend draws them, each with its
  // position's key) against verify_exact on the logits themselves, greedy and sampled, for every
  // length of matching prefix and no drafts at all.
  for (const float temperature : {0.0f, 0.9f}) {
    SamplingParams params;
    params.temperature = temperature;
    params.top_k = 8;
    params.top_p = 0.95f;
    params.seed = 31;
    ASSERT_TRUE(params.logits_only());
    const std::vector<int32_t> prompt{3, 1, 4};
    const std::vector<int32_t> plain = plain_decode(prompt, params, 7);
    const std::vector<int32_t> next(plain.begin() + 3, plain.end());
    const std::span<const int32_t> p(prompt);
    for (int good = 0; good <= 6; ++good) {
      std::vector<int32_t> drafts(next.begin(), next.begin() + std::min(good + 1, 6));
      if (good < 6) drafts[static_cast<size_t>(good)] = (drafts[static_cast<size_t>(good)] + 5) % kVocab;
      if (good == 6) drafts.assign(next.begin(), next.begin() + 6);
      std::vector<float> window;
      std::vector<int32_t> targets, seen = prompt;
      for (size_t i = 0; i <= drafts.size(); ++i) {
        const std::vector<float> row = target_logits(seen);
        window.insert(window.end(), row.begin(), row.end());
        targets.push_back(sample(row, sample_row(params, 3 + i)));
        if (i < drafts.size()) seen.push_back(drafts[i]);
      }
      const VerifyResult want = verify_exact(window, kVocab, drafts, params, {p, {}}, 3);
      const VerifyResult got = verify_exact(targets, drafts);
      EXPECT_EQ(got.accepted, want.accepted) << "T " << temperature << " good " << good;
      EXPECT_EQ(got.emitted, want.emitted) << "T " << temperature << " good " << good;
      EXPECT_EQ(got.accepted, good) << "T " << temperature << " good " << good;
    }
  }
  EXPECT_THROW(verify_exact(std::vector<int32_t>{1, 2}, std::vector<int32_t>{1, 2}), Error);
  SamplingParams penalised;
  penalised.repetition_penalty = 1.2f;  // reads the history: no SampleRow
  EXPECT_FALSE(penalised.logits_only());
  EXPECT_THROW(sample_row(penalised, 0), Error);
}

TEST(VerifierRejection, GreedyIsExactMatching) {
  const std::vector<int32_t> prompt{7, 7, 3};
  SamplingParams params;
  params.temperature = 0.0f;
  const std::vector<int32_t> plain = plain_decode(prompt, params, 120);
  EXPECT_EQ(spec_decode(prompt, params, 120, plain, true), plain);
}

TEST(VerifierRejection, DeterministicDraftsKeepTheOutputDistribution) {
  // The target is history-dependent; rejection mode with one-hot drafts still produces valid
  // sequences whose tokens at each step follow the target. Check the marginal of the first
  // generated token over many seeds against p.
  SamplingParams params;
  const std::vector<int32_t> prompt{2, 9};
  const std::vector<float> logits = target_logits(prompt);
  const std::vector<float> p = probabilities(logits, params, prompt, {});
  const int n = 30000;
  std::vector<double> freq(kVocab, 0.0);
  for (int s = 0; s < n; ++s) {
    params.seed = static_cast<uint64_t>(s);
    std::vector<int32_t> drafts{3, 4};
    std::vector<int32_t> seen = prompt;
    std::vector<float> window;
    for (size_t i = 0; i <= drafts.size(); ++i) {
      const std::vector<float> row = target_logits(seen);
      window.insert(window.end(), row.begin(), row.end());
      if (i < drafts.size()) seen.push_back(drafts[i]);
    }
    const VerifyResult r = verify_rejection(window, kVocab, drafts, {}, params, {prompt, {}}, 2);
    freq[static_cast<size_t>(r.emitted[0])] += 1.0 / n;
  }
  double tv = 0;
  for (size_t v = 0; v < kVocab; ++v) tv += 0.5 * std::abs(freq[v] - p[v]);
  EXPECT_LT(tv, 0.02);
}

// Small-vocabulary speculative sampling with known p and q.
struct Bernoulli6 {
  std::vector<float> p{0.30f, 0.05f, 0.25f, 0.10f, 0.20f, 0.10f};
  std::vector<float> q{0.05f, 0.35f, 0.10f, 0.30f, 0.15f, 0.05f};
  std::vector<float> logits() const {
    std::vector<float> l;
    for (float x : p) l.push_back(std::log(x));
    return l;
  }
};

double total_variation(const std::vector<double>& a, const std::vector<float>& b) {
  double tv = 0;
  for (size_t i = 0; i < a.size(); ++i) tv += 0.5 * std::abs(a[i] - b[i]);
  return tv;
}

// Emitted first-token frequencies over n positions, drafts drawn from q on their own stream.
std::vector<double> first_token_frequencies(const Bernoulli6& d, int n, size_t k,
                                            double* accept_rate) {
  SamplingParams params;
  params.seed = 31337;
  const std::vector<float> row = d.logits();
  std::vector<float> window;
  for (size_t i = 0; i <= k; ++i) window.insert(window.end(), row.begin(), row.end());
  const std::vector<std::vector<float>> q(k, d.q);
  std::vector<double> freq(d.p.size(), 0.0);
  const std::vector<int32_t> prompt{0};
  long accepted = 0;
  for (int s = 0; s < n; ++s) {
    const uint64_t position = static_cast<uint64_t>(s) * 8;
    std::vector<int32_t> drafts;
    for (size_t i = 0; i < k; ++i)
      drafts.push_back(sample_from_weights(d.q, uniform01(4242, position + i, 5)));
    const VerifyResult r = verify_rejection(window, 6, drafts, q, params, {prompt, {}}, position);
    freq[static_cast<size_t>(r.emitted[0])] += 1.0 / n;
    accepted += r.accepted > 0;
  }
  if (accept_rate) *accept_rate = static_cast<double>(accepted) / n;
  return freq;
}

TEST(VerifierRejection, FirstTokenDistributionConvergesToTarget) {
  const Bernoulli6 d;
  double rate = 0;
  const std::vector<double> small = first_token_frequencies(d, 2000, 2, nullptr);
  const std::vector<double> large = first_token_frequencies(d, 50000, 2, &rate);
  const double tv_pq = [&] {
    double tv = 0;
    for (size_t i = 0; i < 6; ++i) tv += 0.5 * std::abs(d.p[i] - d.q[i]);
    return tv;
  }();
  EXPECT_NEAR(tv_pq, 0.5, 1e-6);
  // Expected TV of an empirical 6-way distribution: ~0.02 at 2k draws, ~0.004 at 50k.
  EXPECT_LT(total_variation(large, d.p), total_variation(small, d.p));
  EXPECT_LT(total_variation(large, d.p), 0.012);
  // The control: the draft distribution is far away.
  EXPECT_GT(total_variation(large, d.q), 0.45);
  // Acceptance probability of one draft is sum(min(p, q)) = 1 - TV(p, q).
  EXPECT_NEAR(rate, 1.0 - tv_pq, 0.01);
}

TEST(VerifierRejection, EveryEmittedTokenFollowsTargetOverLongRuns) {
  // An i.i.d. target: the concatenation of all rounds' emitted tokens must be distributed as p,
  // including bonus tokens and tokens after accepted drafts.
  const Bernoulli6 d;
  SamplingParams params;
  params.seed = 5;
  const std::vector<float> row = d.logits();
  const size_t k = 3;
  std::vector<float> window;
  for (size_t i = 0; i <= k; ++i) window.insert(window.end(), row.begin(), row.end());
  const std::vector<std::vector<float>> q(k, d.q);
  std::vector<double> freq(6, 0.0);
  std::vector<int32_t> tokens{0};
  while (tokens.size() < 60001) {
    const uint64_t position = tokens.size();
    std::vector<int32_t> drafts;
    for (size_t i = 0; i < k; ++i)
      drafts.push_back(sample_from_weights(d.q, uniform01(99, position + i, 5)));
    const VerifyResult r = verify_rejection(window, 6, drafts, q, params, {{}, {}}, position);
    tokens.insert(tokens.end(), r.emitted.begin(), r.emitted.end());
  }
  for (size_t i = 1; i < tokens.size(); ++i)
    freq[static_cast<size_t>(tokens[i])] += 1.0 / static_cast<double>(tokens.size() - 1);
  EXPECT_LT(total_variation(freq, d.p), 0.012);
}

TEST(Verifier, RejectsMalformedInput) {
  SamplingParams params;
  const std::vector<float> window(3 * 4, 0.0f);
  const std::vector<int32_t> two{1, 2};
  EXPECT_THROW(verify_exact(window, 4, std::vector<int32_t>{1}, params, {}, 0), Error);     // size
  EXPECT_THROW(verify_exact(window, 4, std::vector<int32_t>{1, 4}, params, {}, 0), Error);  // vocab
  EXPECT_THROW(verify_exact(window, 0, two, params, {}, 0), Error);
  const std::vector<std::vector<float>> q_count(1, std::vector<float>(4, 0.25f));
  EXPECT_THROW(verify_rejection(window, 4, two, q_count, params, {}, 0), Error);
  const std::vector<std::vector<float>> q_width(2, std::vector<float>(3, 0.25f));
  EXPECT_THROW(verify_rejection(window, 4, two, q_width, params, {}, 0), Error);
  const std::vector<std::vector<float>> q_ok{std::vector<float>(4, 0.25f), {}};
  EXPECT_NO_THROW(verify_rejection(window, 4, two, q_ok, params, {}, 0));
}

TEST(Verifier, CutBurstStopsAtEosOrBudget) {
  const std::vector<int32_t> burst{5, 6, 2, 7};
  const std::vector<int32_t> eos{2, 9};
  BurstCut c = cut_burst(burst, eos, 10);
  EXPECT_EQ(c.kept, 3u);
  EXPECT_TRUE(c.eos);
  EXPECT_FALSE(c.length);
  c = cut_burst(burst, eos, 2);
  EXPECT_EQ(c.kept, 2u);
  EXPECT_FALSE(c.eos);
  EXPECT_TRUE(c.length);
  c = cut_burst(burst, eos, 3);  // EOS is the last allowed token: it is an EOS stop
  EXPECT_EQ(c.kept, 3u);
  EXPECT_TRUE(c.eos);
  c = cut_burst(burst, {}, 10);
  EXPECT_EQ(c.kept, 4u);
  EXPECT_FALSE(c.eos);
  EXPECT_FALSE(c.length);
  c = cut_burst(burst, {}, 4);
  EXPECT_EQ(c.kept, 4u);
  EXPECT_TRUE(c.length);
  c = cut_burst(burst, eos, 0);
  EXPECT_EQ(c.kept, 0u);
  EXPECT_TRUE(c.length);
}

}  // namespace
}  // namespace specdec
