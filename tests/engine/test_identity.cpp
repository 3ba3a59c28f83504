// Speculative output equals plain output token for token: every method, depths 1..10, greedy and
// seeded sampling, alone and in batches whose rows join and leave mid-run, with stop strings
// that land inside accepted bursts. Plain output itself equals the transformers fixtures.
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine_fixture.h"

namespace specdec::testing {
namespace {

const std::vector<std::string>& prompts() {
  static const std::vector<std::string> p = {
      "def fibonacci(n):\n",
      "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        "
      "self.items.append(item)\n\n    def pop(self):\n",
      "import os\nimport sys\n\n\ndef main():\n",
  };
  return p;
}

TEST(EngineIdentity, PlainGreedyMatchesTransformers) {
  std::ifstream in(source_path("tests/fixtures/bundled/greedy.json"));
  const auto fx = nlohmann::json::parse(in);
  auto engine = make_engine();
  for (size_t i = 0; i < 4; ++i) {
    const auto prompt = fx["prompts"][i].get<std::vector<int32_t>>();
    const auto want = fx["target"]["greedy"][i].get<std::vector<int32_t>>();
    EXPECT_EQ(run_one(*engine, make_request(prompt, 64)).tokens, want) << "prompt " << i;
  }
}

struct Case {
  std::string method;
  int depth;
  float temperature;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.method << " depth " << c.depth << " T " << c.temperature; }

class SpecIdentity : public ::testing::TestWithParam<Case> {};

TEST_P(SpecIdentity, SameTokensAsPlain) {
  const Case c = GetParam();
  int64_t drafted = 0, accepted = 0;
  for (const auto& text : prompts()) {
    const auto prompt = encode(text);
    const uint64_t seed = 1234;
    const auto want = plain(prompt, 40, c.temperature, seed);
    auto engine = make_engine(c.depth);
    Request r = make_request(prompt, 40, c.temperature, seed);
    r.spec.method = c.method;
    r.spec.max_depth = c.depth;
    r.spec.adaptive = false;
    const RequestResult got = run_one(*engine, std::move(r));
    EXPECT_EQ(got.tokens, want) << c.method << " depth " << c.depth << " T " << c.temperature;
    const auto& t = got.stats.speculative;
    EXPECT_LE(t.accepted, t.drafted);
    EXPECT_EQ(t.emitted, t.accepted + t.rounds);
    EXPECT_LT(engine->target_forwards(), 1000);
    drafted += t.drafted;
    accepted += t.accepted;
  }
  // The identity would hold for a method that never proposes: this one must draft and be right.
  EXPECT_GT(drafted, 0) << c.method << " never drafted";
  EXPECT_GT(accepted, 0) << c.method << " never had a draft accepted";
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* m : {"ngram", "draft"})
    for (int d : {1, 2, 4, 8, 10})
      for (float t : {0.0f, 0.8f}) out.push_back({m, d, t});
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllMethods, SpecIdentity, ::testing::ValuesIn(cases()), [](const auto& info) {
  return info.param.method + "_d" + std::to_string(info.param.depth) + (info.param.temperature > 0 ? "_t08" : "_greedy");
});

TEST(EngineIdentity, DraftModelActuallyAccepts) {
  // The identity above would also hold for a method that never proposes; make sure this one does.
  auto engine = make_engine(4);
  Request r = make_request(encode(prompts()[1]), 40);
  r.spec.method = "draft";
  r.spec.adaptive = false;
  const RequestResult got = run_one(*engine, std::move(r));
  EXPECT_GT(got.stats.speculative.accepted, 5);
  EXPECT_LT(engine->target_forwards(), 40);
}

TEST(EngineIdentity, MixedBatchJoinAndLeave) {
  // Rows with different methods, depths, temperatures and lengths join and leave mid-run; each
  // must produce exactly its solo plain output.
  struct Spec {
    size_t prompt;
    std::string method;
    int max_tokens;
    float temperature;
  };
  const std::vector<Spec> specs = {{0, "", 30, 0},       {1, "ngram", 45, 0}, {2, "draft", 25, 0.8f},
                                   {1, "draft", 35, 0},  {0, "ngram", 20, 0.8f}, {2, "", 40, 0.8f}};
  std::vector<std::vector<int32_t>> want;
  for (const auto& s : specs) want.push_back(plain(encode(prompts()[s.prompt]), s.max_tokens, s.temperature, 77));

  auto engine = make_engine(4);
  std::vector<int64_t> ids;
  auto submit = [&](const Spec& s) {
    Request r = make_request(encode(prompts()[s.prompt]), s.max_tokens, s.temperature, 77);
    r.spec.method = s.method;
    r.spec.adaptive = false;  // every speculating row drafts each round (a policy may pause it)
    ids.push_back(engine->submit(std::move(r)));
  };
  submit(specs[0]);
  submit(specs[1]);
  submit(specs[2]);
  for (int i = 0; i < 6; ++i) engine->step();
  submit(specs[3]);
  for (int i = 0; i < 10; ++i) engine->step();
  submit(specs[4]);
  submit(specs[5]);
  engine->run();
  for (size_t i = 0; i < specs.size(); ++i) {
    auto res = engine->take_result(ids[i]);
    ASSERT_TRUE(res.has_value());
    EXPECT_EQ(res->tokens, want[i]) << "row " << i << " method '" << specs[i].method << "'";
    if (!specs[i].method.empty()) {
      EXPECT_GT(res->stats.speculative.drafted, 0) << "row " << i;
    }
  }
}

TEST(EngineIdentity, StopStringsInsideBursts) {
  const auto prompt = encode(prompts()[1]);
  auto engine = make_engine();
  const RequestResult full = run_one(*engine, make_request(prompt, 60));
  ASSERT_GT(full.text.size(), 40u);
  // A stop string from the middle of the plain text: it fires inside an accepted burst.
  const std::string stop = full.text.substr(25, 6);
  Request base = make_request(prompt, 60);
  base.stop.stop_strings = {stop};
  const RequestResult plain_stop = run_one(*make_engine(), base);
  EXPECT_EQ(plain_stop.finish, FinishReason::stop);
  EXPECT_EQ(plain_stop.text, full.text.substr(0, full.text.find(stop)));
  for (const char* method : {"ngram", "draft"}) {
    for (int depth : {4, 10}) {
      auto e = make_engine(depth);
      Request r = base;
      r.spec.method = method;
      r.spec.adaptive = false;
      const RequestResult got = run_one(*e, std::move(r));
      EXPECT_GT(got.stats.speculative.accepted, 0) << method << " depth " << depth;
      EXPECT_EQ(got.tokens, plain_stop.tokens) << method << " depth " << depth;
      EXPECT_EQ(got.text, plain_stop.text);
      EXPECT_EQ(got.finish, FinishReason::stop);
    }
  }
}

TEST(EngineIdentity, AdaptivePolicyKeepsOutput) {
  const auto prompt = encode(prompts()[0]);
  const auto want = plain(prompt, 48, 0, 0);
  for (const char* method : {"ngram", "draft"}) {
    auto engine = make_engine();
    Request r = make_request(prompt, 48);
    r.spec.method = method;
    EXPECT_EQ(run_one(*engine, std::move(r)).tokens, want) << method;
  }
}

// Tokens drawn by the backend (the default wherever a row's params need nothing but its logits)
// are the tokens the host draws from the copied logits: rows of different temperatures, filters,
// seeds and methods in one batch, each against its solo run on the host path. A short penalised
// row and a short rejection-mode row send the first iterations to the host path; the rest run on
// the backend. Exact on the CPU; on the GPU, unless a draw lands within ~1e-6 of a CDF boundary
// (about one draw in 10^5).
TEST(EngineSampling, BackendDrawsAreTheHostDraws) {
  struct Spec {
    size_t prompt;
    std::string method;
    float temperature;
    int top_k;
    float top_p, min_p;
  };
  const std::vector<Spec> specs = {{0, "", 0.8f, 0, 1.0f, 0.0f},    {1, "ngram", 0.8f, 40, 0.9f, 0.05f},
                                   {2, "draft", 1.2f, 0, 0.95f, 0.0f}, {1, "", 0.6f, 5, 1.0f, 0.1f},
                                   {0, "draft", 0.0f, 0, 1.0f, 0.0f},  {2, "", 1.0f, 0, 0.5f, 0.0f}};
  const auto request = [&](const Spec& s, uint64_t seed) {
    Request r = make_request(encode(prompts()[s.prompt]), 36, s.temperature, seed);
    r.sampling.top_k = s.top_k;
    r.sampling.top_p = s.top_p;
    r.sampling.min_p = s.min_p;
    r.spec.method = s.method;
    r.spec.adaptive = false;
    return r;
  };
  EngineOptions host;
  host.sample_on_backend = false;
  std::vector<std::vector<int32_t>> want;
  for (size_t i = 0; i < specs.size(); ++i) {
    Request r = request(specs[i], 100 + i);
    r.spec.method.clear();  // plain decoding, every token drawn on the host
    want.push_back(run_one(*make_engine(0, host), std::move(r)).tokens);
  }
  auto engine = make_engine(4);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < specs.size(); ++i) ids.push_back(engine->submit(request(specs[i], 100 + i)));
  Request penalised = request({1, "", 0.8f, 0, 1.0f, 0.0f}, 7);
  penalised.sampling.repetition_penalty = 1.3f;
  penalised.stop.max_tokens = 6;
  const int64_t host_only = engine->submit(std::move(penalised));
  Request rejection = request({2, "draft", 0.8f, 0, 1.0f, 0.0f}, 8);
  rejection.spec.mode = SpecMode::rejection;
  rejection.stop.max_tokens = 6;
  const int64_t weighed = engine->submit(std::move(rejection));
  engine->run();
  for (size_t i = 0; i < specs.size(); ++i) {
    auto res = engine->take_result(ids[i]);
    ASSERT_TRUE(res.has_value());
    EXPECT_EQ(res->tokens, want[i]) << "row " << i << " method '" << specs[i].method << "' T " << specs[i].temperature;
  }
  EXPECT_EQ(engine->take_result(host_only)->tokens.size(), 6u);
  EXPECT_EQ(engine->take_result(weighed)->tokens.size(), 6u);
}

TEST(EngineRejection, GreedyEqualsPlainAndSampledRunsStayValid) {
  const auto prompt = encode(prompts()[1]);
  const auto want = plain(prompt, 32, 0, 0);
  for (const char* method : {"ngram", "draft"}) {
    auto engine = make_engine(4);
    Request r = make_request(prompt, 32);
    r.spec.method = method;
    r.spec.mode = SpecMode::rejection;
    r.spec.adaptive = false;
    EXPECT_EQ(run_one(*engine, std::move(r)).tokens, want) << method;
  }
  // At temperature 0.8 rejection sampling is not sample-identical, but every token is valid,
  // the counters are consistent and the draft model is accepted often.
  auto engine = make_engine(4);
  Request r = make_request(prompt, 48, 0.8f, 5);
  r.spec.method = "draft";
  r.spec.mode = SpecMode::rejection;
  r.spec.adaptive = false;
  const RequestResult got = run_one(*engine, std::move(r));
  ASSERT_EQ(got.tokens.size(), 48u);
  for (int32_t t : got.tokens) EXPECT_TRUE(t >= 0 && t < 8192);
  const auto& t = got.stats.speculative;
  EXPECT_NO_THROW(t.check());
  EXPECT_GT(t.accepted, 0);
  EXPECT_EQ(t.emitted, t.accepted + t.rounds);
}

TEST(EngineRejection, TheDefaultPolicyRepeatsASeededRequestAloneAndInABatch) {
  // A rejection-mode row's depths follow its own rounds' outcomes on fixed prices, never timing
  // or the rows beside it: the same seeded request gives the same tokens and rounds alone, again
  // on a new engine, and beside rows of other methods joining while it runs.
  const auto prompt = encode(prompts()[1]);
  for (const std::string method : {"ngram", "draft", "eagle3", "dflash"}) {
    const auto run = [&](bool crowded) {
      auto engine = make_engine();
      Eagle3Options e;
      e.kv_blocks = 1024;
      engine->add_method("eagle3", bundled_eagle3(e));
      DflashOptions d;
      d.kv_blocks = 1024;
      engine->add_method("dflash", bundled_dflash(d));
      Request r = make_request(prompt, 48, 0.8f, 17);
      r.spec.method = method;
      r.spec.mode = SpecMode::rejection;
      const int64_t id = engine->submit(std::move(r));
      for (int i = 0; crowded && i < 3; ++i) {
        engine->step();
        engine->step();
        Request o = make_request(encode(prompts()[static_cast<size_t>(i)]), 24 + 8 * i, i == 1 ? 0.8f : 0.0f, 3 + i);
        o.spec.method = i == 0 ? "draft" : i == 1 ? "dflash" : "";
        engine->submit(std::move(o));
      }
      engine->run();
      return *engine->take_result(id);
    };
    const RequestResult alone = run(false), again = run(false), crowded = run(true);
    EXPECT_EQ(again.tokens, alone.tokens) << method;
    EXPECT_EQ(crowded.tokens, alone.tokens) << method;
    const SpecTelemetry &a = alone.stats.speculative, &c = crowded.stats.speculative;
    EXPECT_EQ(c.rounds, a.rounds) << method;
    EXPECT_EQ(c.drafted, a.drafted) << method;
    EXPECT_GT(a.drafted, 0) << method;
    report("rejection_policy." + method + "_drafted_per_round", static_cast<double>(a.drafted) / a.rounds);
  }
}

TEST(EngineRequests, BadRequestsAreRefusedAndHarmNothing) {
  auto engine = make_engine();
  const auto prompt = encode(prompts()[0]);
  const int64_t ok = engine->submit(make_request(prompt, 8));
  EXPECT_THROW(engine->submit(make_request({}, 8)), Error);
  EXPECT_THROW(engine->submit(make_request(std::vector<int32_t>(2048, 5), 8)), Error);
  EXPECT_THROW(engine->submit(make_request({1, 2, 99999}, 8)), Error);
  EXPECT_THROW(engine->submit(make_request(prompt, 0)), Error);
  Request bad_method = make_request(prompt, 8);
  bad_method.spec.method = "eagle";
  EXPECT_THROW(engine->submit(std::move(bad_method)), Error);
  Request bad_sampling = make_request(prompt, 8, 0.7f);
  bad_sampling.sampling.top_p = 3.0f;
  EXPECT_THROW(engine->submit(std::move(bad_sampling)), Error);
  engine->run();
  auto res = engine->take_result(ok);
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->tokens, plain(prompt, 8, 0, 0));
}

TEST(EngineRequests, CancelAndKvPressure) {
  // A cache too small for every row at once: rows are preempted and recomputed, and each still
  // produces its solo output; a cancelled row leaves the others intact.
  EngineOptions options;
  options.kv_blocks = 12;
  auto engine = make_engine(4, options);
  std::vector<int64_t> ids;
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 4; ++i) {
    const auto prompt = encode(prompts()[static_cast<size_t>(i) % prompts().size()]);
    want.push_back(plain(prompt, 40, 0, 0));
    Request r = make_request(prompt, 40);
    r.spec.method = i % 2 ? "draft" : "ngram";
    ids.push_back(engine->submit(std::move(r)));
  }
  const int64_t doomed = engine->submit(make_request(encode(prompts()[0]), 40));
  engine->step();
  engine->cancel(doomed);
  engine->run();
  for (size_t i = 0; i < ids.size(); ++i) {
    auto res = engine->take_result(ids[i]);
    ASSERT_TRUE(res.has_value());
    EXPECT_EQ(res->tokens, want[i]) << "row " << i;
  }
  auto cancelled = engine->take_result(doomed);
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_EQ(cancelled->finish, FinishReason::cancelled);
  EXPECT_EQ(engine->kv().free_blocks(), engine->kv().total_blocks());
}

}  // namespace
}  // namespace specdec::testing
