// Prompt logprobs through the public Engine: against transformers' full-sequence logits of the
// bundled target (tests/fixtures/bundled/target_logits.safetensors), in one prefill, in chunks
// and after a prompt that filled the prefix cache; and against the engine's own generated-token
// logprobs: scoring P + C as a prompt gives what generating C from P gave, penalties and bias
// included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "model/weights.h"
#include "specdec/specdec.h"
#include "test_device.h"

namespace {

const std::string kRoot = SPECDEC_SOURCE_DIR;

std::vector<int32_t> fixture_prompt(size_t i) {
  std::ifstream in(kRoot + "/tests/fixtures/bundled/greedy.json");
  return nlohmann::json::parse(in)["prompts"][i].get<std::vector<int32_t>>();
}

specdec::EngineConfig config(int max_batch_tokens = 512, bool prefix_cache = true) {
  specdec::EngineConfig c;
  c.model_dir = kRoot + "/models/target";
  c.device = specdec::DeviceKind::cpu;
  c.cpu_isa = specdec::CpuIsa::best;  // exact f32 kernels: the reference logits are f32
  c.max_batch_tokens = max_batch_tokens;
  c.prefix_cache = prefix_cache;
  c.drafts = {specdec::DraftSpec::ngram(), specdec::DraftSpec::model(kRoot + "/models/draft", "draft")};
  return c;
}

specdec::GenerationRequest request(std::vector<int32_t> prompt, int max_tokens) {
  specdec::GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

// One reference sequence: its tokens and transformers' logits at its last positions.
struct Reference {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<std::vector<double>> logprobs;  // per position: log-softmax of the logits, in double
};

std::vector<Reference> references() {
  auto file = specdec::SafetensorsFile::open(kRoot + "/tests/fixtures/bundled/target_logits.safetensors");
  const auto& t = file->tensors();
  std::vector<Reference> out;
  for (int i = 0; i < 2; ++i) {
    // Named keys: a reference from at(temporary) reads as dangling to g++ 13's warning.
    const std::string suffix = std::to_string(i), tokens_key = "tokens_" + suffix,
                      positions_key = "positions_" + suffix, logits_key = "logits_" + suffix;
    const specdec::Tensor& tokens = t.at(tokens_key);
    const specdec::Tensor& positions = t.at(positions_key);
    const specdec::Tensor& logits = t.at(logits_key);
    Reference ref;
    ref.tokens.assign(tokens.ptr<int32_t>(), tokens.ptr<int32_t>() + tokens.dim(0));
    ref.positions.assign(positions.ptr<int32_t>(), positions.ptr<int32_t>() + positions.dim(0));
    const auto vocab = static_cast<size_t>(logits.dim(1));
    for (size_t j = 0; j < ref.positions.size(); ++j) {
      const float* row = logits.ptr<float>() + j * vocab;
      const double max = *std::max_element(row, row + vocab);
      double sum = 0;
      for (size_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - max);
      std::vector<double> lp(vocab);
      for (size_t v = 0; v < vocab; ++v) lp[v] = row[v] - max - std::log(sum);
      ref.logprobs.push_back(std::move(lp));
    }
    out.push_back(std::move(ref));
  }
  return out;
}

constexpr int kTop = 5;

// `got` scores `token` at a position whose reference distribution is `want`: its logprob, its
// rank and the top alternatives (ids where the reference separates them, values always).
void expect_matches(const specdec::TokenLogprob& got, int32_t token, const std::vector<double>& want) {
  const double tolerance = specdec::testing::logit_tolerance(1e-4);
  EXPECT_EQ(got.token, token);
  EXPECT_NEAR(got.logprob, want[static_cast<size_t>(token)], tolerance);
  specdec::testing::report("|prompt logprob - reference log-softmax|",
                           std::fabs(got.logprob - want[static_cast<size_t>(token)]));
  std::vector<int32_t> order(want.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return want[size_t(a)] > want[size_t(b)]; });
  const auto rank = std::find(order.begin(), order.end(), token) - order.begin() + 1;
  // A rank may move by one where the reference's neighbours are closer than the tolerance.
  EXPECT_NEAR(got.rank, static_cast<double>(rank), 1.0);
  ASSERT_EQ(got.top.size(), static_cast<size_t>(kTop));
  for (size_t k = 0; k < got.top.size(); ++k) {
    SCOPED_TRACE(k);
    const auto [id, logprob] = got.top[k];
    EXPECT_NEAR(logprob, want[static_cast<size_t>(order[k])], tolerance);
    EXPECT_NEAR(want[static_cast<size_t>(id)], logprob, tolerance);
    const double gap = std::min(k > 0 ? want[size_t(order[k - 1])] - want[size_t(order[k])] : 1e9,
                                want[size_t(order[k])] - want[size_t(order[k + 1])]);
    if (gap > 2 * tolerance) {
      EXPECT_EQ(id, order[k]);
    }
  }
}

// The engine's scores of a reference sequence as a prompt: the prompt logprobs at the recorded
// positions but the last, and the first generated token's logprobs at the last.
void expect_scores_match_reference(specdec::Engine& engine, const std::string& draft) {
  for (const Reference& ref : references()) {
    specdec::GenerationRequest r = request(ref.tokens, 1);
    r.prompt_logprobs = kTop;
    r.logprobs = kTop;
    r.speculative.draft = draft;
    const specdec::GenerationResult res = engine.wait(engine.submit(std::move(r)));
    ASSERT_EQ(res.prompt_logprobs.size(), ref.tokens.size() - 1);
    ASSERT_EQ(res.logprobs.size(), 1u);
    for (size_t j = 0; j < ref.positions.size(); ++j) {
      const auto p = static_cast<size_t>(ref.positions[j]);
      SCOPED_TRACE("position " + std::to_string(p));
      if (p + 1 < ref.tokens.size()) {
        // Position p's logits score prompt token p + 1, entry p of prompt_logprobs.
        expect_matches(res.prompt_logprobs[p], ref.tokens[p + 1], ref.logprobs[j]);
      } else {
        expect_matches(res.logprobs[0], res.tokens[0], ref.logprobs[j]);
      }
    }
    // Every entry is a distribution's logprob, and names the prompt's own token.
    for (size_t i = 0; i < res.prompt_logprobs.size(); ++i) {
      EXPECT_EQ(res.prompt_logprobs[i].token, ref.tokens[i + 1]);
      EXPECT_LE(res.prompt_logprobs[i].logprob, res.prompt_logprobs[i].top[0].second + 1e-6f);
    }
  }
}

TEST(PromptLogprobs, MatchTheReferenceLogitsInOnePrefill) {
  specdec::Engine engine(config());
  expect_scores_match_reference(engine, "");
}

TEST(PromptLogprobs, MatchTheReferenceLogitsInChunkedPrefillWithSpeculation) {
  // 16 tokens a forward: the 72-token prompts prefill in five chunks.
  specdec::Engine engine(config(16));
  expect_scores_match_reference(engine, "draft");
}

TEST(PromptLogprobs, ACachedPrefixStillYieldsEveryPromptLogprob) {
  specdec::Engine engine(config(16));
  // The same prompts without prompt logprobs first: their full blocks enter the prefix cache,
  // and a second such request finds them there.
  for (const Reference& ref : references()) engine.wait(engine.submit(request(ref.tokens, 1)));
  const int64_t before = engine.stats().prefix_cache_hits;
  for (const Reference& ref : references()) engine.wait(engine.submit(request(ref.tokens, 1)));
  const int64_t hits = engine.stats().prefix_cache_hits;
  EXPECT_GT(hits, before);
  expect_scores_match_reference(engine, "ngram");
  // A request for prompt logprobs prefilled its whole prompt rather than share the cached blocks.
  EXPECT_EQ(engine.stats().prefix_cache_hits, hits);
}

// P + C scored as a prompt equals C's logprobs when generated from P, with the request's
// repetition penalty and logit bias applied alike (both read the tokens before the position).
TEST(PromptLogprobs, ScoringAContinuationEqualsGeneratingIt) {
  for (int chunk : {512, 16}) {
    SCOPED_TRACE(chunk);
    specdec::Engine engine(config(chunk));
    for (bool penalised : {false, true}) {
      SCOPED_TRACE(penalised);
      for (size_t i : {0, 5}) {
        const std::vector<int32_t> prompt = fixture_prompt(i);
        specdec::GenerationRequest gen = request(prompt, 24);
        gen.logprobs = 3;
        if (penalised) {
          gen.sampling.repetition_penalty = 1.3f;
          gen.sampling.logit_bias = {{262, 2.5f}, {266, -3.0f}};
        }
        specdec::GenerationRequest score = gen;
        const specdec::GenerationResult generated = engine.wait(engine.submit(std::move(gen)));
        ASSERT_EQ(generated.tokens.size(), 24u);
        score.prompt_tokens.insert(score.prompt_tokens.end(), generated.tokens.begin(), generated.tokens.end());
        score.max_tokens = 1;
        score.logprobs.reset();
        score.prompt_logprobs = 3;
        const specdec::GenerationResult scored = engine.wait(engine.submit(std::move(score)));
        ASSERT_EQ(scored.prompt_logprobs.size(), prompt.size() + generated.tokens.size() - 1);
        for (size_t k = 0; k < generated.tokens.size(); ++k) {
          SCOPED_TRACE(k);
          const specdec::TokenLogprob& a = scored.prompt_logprobs[prompt.size() - 1 + k];
          const specdec::TokenLogprob& b = generated.logprobs[k];
          EXPECT_EQ(a.token, b.token);
          EXPECT_NEAR(a.logprob, b.logprob, 1e-4);
          EXPECT_EQ(a.rank, 1);  // greedy generation took the most likely token
          ASSERT_EQ(a.top.size(), b.top.size());
          for (size_t j = 0; j < a.top.size(); ++j) {
            EXPECT_EQ(a.top[j].first, b.top[j].first);
            EXPECT_NEAR(a.top[j].second, b.top[j].second, 1e-4);
          }
        }
        EXPECT_TRUE(generated.prompt_logprobs.empty());  // not asked for
      }
    }
  }
}

TEST(PromptLogprobs, TheFirstEventCarriesThemAndBadCountsAreRefused) {
  specdec::Engine engine(config(16));
  std::vector<specdec::TokenLogprob> streamed;
  int events_with_them = 0;
  specdec::GenerationRequest r = request(fixture_prompt(3), 6);
  r.prompt_logprobs = 0;
  r.on_event = [&](const specdec::GenerationEvent& e) {
    if (!e.prompt_logprobs.empty()) ++events_with_them;
    streamed.insert(streamed.end(), e.prompt_logprobs.begin(), e.prompt_logprobs.end());
  };
  const specdec::GenerationResult res = engine.wait(engine.submit(std::move(r)));
  EXPECT_EQ(events_with_them, 1);
  ASSERT_EQ(streamed.size(), res.prompt_logprobs.size());
  ASSERT_EQ(res.prompt_logprobs.size(), fixture_prompt(3).size() - 1);
  for (size_t i = 0; i < streamed.size(); ++i) {
    EXPECT_EQ(streamed[i].token, res.prompt_logprobs[i].token);
    EXPECT_EQ(streamed[i].logprob, res.prompt_logprobs[i].logprob);
    EXPECT_TRUE(streamed[i].top.empty());
  }
  // A one-token prompt has nothing to score.
  specdec::GenerationRequest one = request({298}, 2);
  one.prompt_logprobs = 2;
  EXPECT_TRUE(engine.wait(engine.submit(std::move(one))).prompt_logprobs.empty());
  for (int bad : {-1, 21}) {
    specdec::GenerationRequest b = request(fixture_prompt(0), 2);
    b.prompt_logprobs = bad;
    EXPECT_THROW(engine.submit(std::move(b)), std::exception) << bad;
  }
}

}  // namespace
