// Logprobs, logit_bias, stop token ids, the bounded waiting queue and the engine's stats through
// the public Engine: logprobs and biased output are the same with and without speculation, a
// bias that bans the greedy token yields the runner-up that the unbiased logprobs ranked second,
// and a full queue refuses with QueueFull.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "specdec/specdec.h"

namespace {

const std::string kRoot = SPECDEC_SOURCE_DIR;

std::string prompt(size_t i) {
  std::ifstream in(kRoot + "/tests/fixtures/bundled/greedy.json");
  return nlohmann::json::parse(in)["prompts_text"][i].get<std::string>();
}

specdec::EngineConfig config() {
  specdec::EngineConfig c;
  c.model_dir = kRoot + "/models/target";
  c.device = specdec::DeviceKind::cpu;
  c.drafts = {specdec::DraftSpec::ngram(), specdec::DraftSpec::model(kRoot + "/models/draft", "draft")};
  return c;
}

specdec::GenerationRequest request(const std::string& text, int max_tokens, const std::string& draft) {
  specdec::GenerationRequest r;
  r.prompt = text;
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  r.speculative.draft = draft;
  return r;
}

void expect_same_logprobs(const std::vector<specdec::TokenLogprob>& a, const std::vector<specdec::TokenLogprob>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(a[i].token, b[i].token);
    EXPECT_NEAR(a[i].logprob, b[i].logprob, 1e-4);
    ASSERT_EQ(a[i].top.size(), b[i].top.size());
    for (size_t j = 0; j < a[i].top.size(); ++j) {
      EXPECT_EQ(a[i].top[j].first, b[i].top[j].first);
      EXPECT_NEAR(a[i].top[j].second, b[i].top[j].second, 1e-4);
    }
  }
}

TEST(EngineLogprobs, SameWithAndWithoutSpeculationAndConsistentWithTheTokens) {
  specdec::Engine engine(config());
  for (float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE(temperature);
    std::vector<specdec::GenerationResult> results;
    for (const std::string draft : {"", "ngram", "draft"}) {
      specdec::GenerationRequest r = request(prompt(1), 20, draft);
      r.sampling.temperature = temperature;
      r.sampling.seed = 7;
      r.logprobs = 4;
      results.push_back(engine.wait(engine.submit(std::move(r))));
    }
    const specdec::GenerationResult& plain = results[0];
    ASSERT_EQ(plain.logprobs.size(), plain.tokens.size());
    for (size_t i = 0; i < plain.tokens.size(); ++i) {
      const specdec::TokenLogprob& t = plain.logprobs[i];
      EXPECT_EQ(t.token, plain.tokens[i]);
      ASSERT_EQ(t.top.size(), 4u);
      EXPECT_LE(t.logprob, 0.0f);
      double mass = 0;
      for (size_t j = 0; j < t.top.size(); ++j) {
        mass += std::exp(t.top[j].second);
        if (j > 0) {
          EXPECT_GE(t.top[j - 1].second, t.top[j].second);
        }
      }
      EXPECT_LE(mass, 1.0 + 1e-5);
      // Greedy picks the most likely token; a sampled one is never more likely than the top.
      if (temperature == 0) {
        EXPECT_EQ(t.top[0].first, t.token);
      }
      EXPECT_LE(t.logprob, t.top[0].second + 1e-6);
    }
    for (size_t m = 1; m < results.size(); ++m) {
      EXPECT_EQ(results[m].tokens, plain.tokens);
      expect_same_logprobs(results[m].logprobs, plain.logprobs);
    }
  }
}

TEST(EngineLogprobs, StreamedLogprobsFollowTheTokens) {
  specdec::Engine engine(config());
  std::vector<specdec::TokenLogprob> streamed;
  specdec::GenerationRequest r = request(prompt(0), 12, "draft");
  r.logprobs = 0;
  r.on_event = [&](const specdec::GenerationEvent& e) {
    streamed.insert(streamed.end(), e.logprobs.begin(), e.logprobs.end());
  };
  const specdec::GenerationResult result = engine.wait(engine.submit(std::move(r)));
  expect_same_logprobs(streamed, result.logprobs);
  for (const auto& t : result.logprobs) EXPECT_TRUE(t.top.empty());
}

TEST(EngineLogprobs, LogitBiasBansAndForcesTokensIdenticallyWithSpeculation) {
  specdec::Engine engine(config());
  specdec::GenerationRequest probe = request(prompt(2), 1, "");
  probe.logprobs = 2;
  const specdec::GenerationResult unbiased = engine.wait(engine.submit(std::move(probe)));
  ASSERT_EQ(unbiased.logprobs.size(), 1u);
  const int32_t best = unbiased.logprobs[0].top[0].first, second = unbiased.logprobs[0].top[1].first;
  std::vector<std::vector<int32_t>> outputs;
  for (const std::string draft : {"", "ngram", "draft"}) {
    specdec::GenerationRequest r = request(prompt(2), 16, draft);
    r.sampling.logit_bias = {{best, -100.0f}};
    r.logprobs = 1;
    const specdec::GenerationResult res = engine.wait(engine.submit(std::move(r)));
    ASSERT_FALSE(res.tokens.empty());
    EXPECT_EQ(res.tokens[0], second);  // the runner-up the unbiased distribution ranked second
    for (int32_t t : res.tokens) EXPECT_NE(t, best);
    outputs.push_back(res.tokens);
  }
  EXPECT_EQ(outputs[1], outputs[0]);
  EXPECT_EQ(outputs[2], outputs[0]);
  // +100 makes one token all but certain at every position.
  specdec::GenerationRequest forced = request(prompt(2), 6, "ngram");
  forced.sampling.logit_bias = {{second, 100.0f}};
  forced.logprobs = 0;
  const specdec::GenerationResult f = engine.wait(engine.submit(std::move(forced)));
  EXPECT_EQ(f.tokens, std::vector<int32_t>(6, second));
  for (const auto& t : f.logprobs) EXPECT_GT(t.logprob, -1e-3f);
}

TEST(EngineLogprobs, StopTokenIdsEndLikeEosWhateverIgnoreEosSays) {
  specdec::Engine engine(config());
  const specdec::GenerationResult full = engine.wait(engine.submit(request(prompt(3), 12, "")));
  ASSERT_GE(full.tokens.size(), 6u);
  specdec::GenerationRequest r = request(prompt(3), 12, "draft");
  r.stop_token_ids = {full.tokens[5]};
  const specdec::GenerationResult cut = engine.wait(engine.submit(std::move(r)));
  const auto at = std::find(full.tokens.begin(), full.tokens.end(), full.tokens[5]) - full.tokens.begin();
  EXPECT_EQ(cut.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + at));
  EXPECT_EQ(cut.finish, specdec::Finish::eos);
}

TEST(EngineQueue, AFullQueueRefusesWithQueueFullAndStatsTellTheState) {
  specdec::EngineConfig c = config();
  c.max_rows = 1;
  c.max_queue = 1;
  specdec::Engine engine(c);
  // One row and one waiting place: a third request has nowhere to go, whichever of the first two
  // the loop has admitted by then. The prompt spans full KV blocks, which b then finds cached.
  const std::string shared = prompt(4) + "\n" + prompt(5) + "\n" + prompt(8);
  const int64_t a = engine.submit(request(shared, 40, "ngram"));
  const int64_t b = engine.submit(request(shared, 8, ""));
  EXPECT_THROW(engine.submit(request(prompt(1), 8, "")), specdec::QueueFull);
  engine.wait(a);
  engine.wait(b);
  // Room again once they are done.
  engine.wait(engine.submit(request(prompt(1), 4, "")));
  specdec::EngineStats s = engine.stats();
  for (int i = 0; i < 200 && (s.running || s.waiting); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s = engine.stats();
  }
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);  // blocks kept for the prefix cache are free to take
  EXPECT_GT(s.kv_blocks_total, 0);
  EXPECT_GT(s.iterations, 0);
  EXPECT_GT(s.prefix_cache_queries, 0);
  EXPECT_GT(s.prefix_cache_hits, 0);  // b repeated a's prompt
  ASSERT_EQ(s.speculation.count("ngram"), 1u);
  const specdec::DraftMethodStats ngram = s.speculation.at("ngram");
  EXPECT_EQ(ngram.emitted, ngram.accepted + ngram.rounds);
  int64_t at = 0;
  for (int64_t v : ngram.accepted_at) at += v;
  EXPECT_EQ(at, ngram.accepted);
}

}  // namespace

namespace {

TEST(EngineStats, EveryDecodeIterationIsTimedOrCountedOneOff) {
  // One plain request alone: the prefill covers all of the prompt but its last token, which is
  // the first decode step's, so each of the 16 tokens comes from an iteration that only decoded,
  // which the stats count either among the timed decode iterations or among those whose forward
  // paid one-off costs, never both.
  specdec::Engine engine(config());
  const specdec::GenerationResult r = engine.wait(engine.submit(request(prompt(2), 16, "")));
  ASSERT_EQ(r.stats.generated_tokens, 16);
  specdec::EngineStats s = engine.stats();
  for (int i = 0; i < 200 && s.running; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s = engine.stats();
  }
  EXPECT_EQ(s.decode_iterations + s.one_off_iterations, 16);
  EXPECT_GE(s.one_off_iterations, 0);
  EXPECT_GE(s.one_off_seconds, 0.0);
  EXPECT_EQ(s.one_off_iterations == 0, s.one_off_seconds == 0.0);
  EXPECT_GT(s.decode_iteration_seconds, 0.0);
}

}  // namespace
