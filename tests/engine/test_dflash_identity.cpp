// The DFlash drafter (models/dflash, trained for the bundled target) in the engine: output equal to
// plain decoding token for token at every block size, greedy and seeded sampling, with and
// without the DSpark confidence cut, alone and in batches whose rows join and leave beside rows
// of other methods, with stop strings inside accepted bursts; rejection mode at temperature 0
// (where it is exact matching) also equals plain decoding.
#include "engine_fixture.h"
#include "speculative/methods/dflash.h"

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

struct Methods {
  std::shared_ptr<DflashMethod> cut, fixed, own;
};

// An engine with the bundled methods plus "dflash" (confidence cut), "dflash-fixed" (none) and
// "dflash-own" (no cut, and no row proposes the context's continuation).
std::unique_ptr<EngineCore> make_dflash_engine(int depth, Methods* out = nullptr) {
  auto engine = make_engine(depth);
  DflashOptions o;
  o.num_draft = depth;
  auto cut = bundled_dflash(o);
  o.confidence_cut = false;
  auto fixed = bundled_dflash(o);
  o.context_lookup = false;
  auto own = bundled_dflash(o);
  EXPECT_TRUE(cut->cuts());
  engine->add_method("dflash", cut);
  engine->add_method("dflash-fixed", fixed);
  engine->add_method("dflash-own", own);
  if (out) *out = {cut, fixed, own};
  return engine;
}

// The complete-parser prompt of the bench suite: after it the bundled target loops through
// " help='skip" "ping',", three to a line.
const char* kLoopingPrompt =
    "import argparse\nimport sys\n\n\ndef parse_args(argv=None):\n    parser = "
    "argparse.ArgumentParser(description=";

struct Case {
  std::string method;
  int depth;
  float temperature;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.method << " depth " << c.depth << " T " << c.temperature; }

class DflashIdentity : public ::testing::TestWithParam<Case> {};

TEST_P(DflashIdentity, SameTokensAsPlain) {
  const Case c = GetParam();
  int64_t drafted = 0, accepted = 0;
  for (const auto& text : prompts()) {
    const auto prompt = encode(text);
    const uint64_t seed = 1234;
    const auto want = plain(prompt, 40, c.temperature, seed);
    auto engine = make_dflash_engine(c.depth);
    Request r = make_request(prompt, 40, c.temperature, seed);
    r.spec.method = c.method;
    r.spec.max_depth = c.depth;
    r.spec.adaptive = false;
    const RequestResult got = run_one(*engine, std::move(r));
    EXPECT_EQ(got.tokens, want) << c.method << " depth " << c.depth << " T " << c.temperature;
    const auto& t = got.stats.speculative;
    EXPECT_LE(t.accepted, t.drafted);
    EXPECT_EQ(t.emitted, t.accepted + t.rounds);
    drafted += t.drafted;
    accepted += t.accepted;
  }
  EXPECT_GT(drafted, 0) << c.method << " never drafted";
  EXPECT_GT(accepted, 0) << c.method << " never had a draft accepted";
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int d = 1; d <= 7; ++d)  // block sizes 2..8
    for (float t : {0.0f, 0.8f}) out.push_back({"dflash-fixed", d, t});
  for (int d : {2, 7}) out.push_back({"dflash-own", d, 0.0f});
  for (int d : {3, 7})
    for (float t : {0.0f, 0.8f}) out.push_back({"dflash", d, t});
  return out;
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, DflashIdentity, ::testing::ValuesIn(cases()), [](const auto& info) {
  const std::string& name = info.param.method;
  std::string m = name == "dflash" ? "cut" : name == "dflash-own" ? "own" : "fixed";
  return m + "_d" + std::to_string(info.param.depth) + (info.param.temperature > 0 ? "_t08" : "_greedy");
});

TEST(DflashEngine, AcceptsLongBurstsAndTheCutShortensSomeRounds) {
  Methods m;
  auto engine = make_dflash_engine(7, &m);
  const auto prompt = encode(prompts()[1]);
  const auto want = plain(prompt, 64, 0, 0);
  for (const char* method : {"dflash-fixed", "dflash"}) {
    Request r = make_request(prompt, 64);
    r.spec.method = method;
    r.spec.adaptive = false;
    const RequestResult got = run_one(*engine, std::move(r));
    EXPECT_EQ(got.tokens, want) << method;
    const auto& t = got.stats.speculative;
    // A drafter that reads the target's own hidden states accepts well over a draft a round here
    // at the depth asked. The cut's lengths follow the machine's measured prices: on a slow or
    // loaded build (a sanitizer's) they may cut every round to nothing, so for it only the
    // accounting is checked.
    EXPECT_LE(t.accepted, t.drafted) << method;
    EXPECT_EQ(t.emitted, t.accepted + t.rounds) << method;
    if (std::string(method) == "dflash-fixed") {
      EXPECT_GT(t.accepted, 1.5 * t.rounds) << method;
    }
  }
  // Without measured prices (a fresh engine's first rounds) the cut keeps the policy's depth; once
  // they are measured it proposes fewer drafts in some rounds.
  EXPECT_EQ(m.fixed->stats().proposed, m.fixed->stats().asked);
  EXPECT_LE(m.cut->stats().proposed, m.cut->stats().asked);
  EXPECT_GT(m.cut->stats().rounds, 0);
}

TEST(DflashEngine, RowsRepeatingTheirNeighbourProposeTheRunnerUp) {
  // After this prompt the target loops through " help='skip" "ping',", where the drafter's later
  // rows collapse onto "='". A repeating row proposes its runner-up instead; verification scores
  // both at every such row reached, and here the runner-up was the target's token more often.
  // Output identical to plain.
  // (The rows do not propose the context's continuation here, which would stand in for most of
  // the repeats.)
  Methods m;
  auto engine = make_dflash_engine(7, &m);
  const auto prompt = encode(kLoopingPrompt);
  const auto want = plain(prompt, 96, 0, 0);
  Request r = make_request(prompt, 96);
  r.spec.method = "dflash-own";
  r.spec.adaptive = false;
  const RequestResult got = run_one(*engine, std::move(r));
  EXPECT_EQ(got.tokens, want);
  const DflashStats st = m.own->stats();
  EXPECT_GT(st.swapped, 0);
  EXPECT_GT(st.scored, 0);
  EXPECT_GT(st.runner_right, st.repeat_right) << st.scored << " repeating rows scored";
  EXPECT_EQ(st.lookup.looked_up, 0);
  EXPECT_EQ(st.lookup.scored, 0);
}

TEST(DflashEngine, RowsTheContextContinuesProposeItsContinuation) {
  // On the looping text the drafter's later rows lose the thread (they do not see the rows before
  // them) where the text's own earlier lines say what comes next. A greedy row proposes that
  // continuation while it has been right at least as often as the row's argmax: here it was right
  // far more often, and the rounds accept more. Output identical to plain, with and without.
  Methods m;
  auto engine = make_dflash_engine(7, &m);
  const auto prompt = encode(kLoopingPrompt);
  const auto want = plain(prompt, 96, 0, 0);
  double tokens_a_round[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    Request r = make_request(prompt, 96);
    r.spec.method = i == 0 ? "dflash-own" : "dflash-fixed";
    r.spec.adaptive = false;
    const RequestResult got = run_one(*engine, std::move(r));
    EXPECT_EQ(got.tokens, want) << r.spec.method;
    const auto& t = got.stats.speculative;
    tokens_a_round[i] = static_cast<double>(t.emitted) / static_cast<double>(t.rounds);
  }
  const DflashStats st = m.fixed->stats();
  EXPECT_GT(st.lookup.looked_up, 0);
  EXPECT_GT(st.lookup.scored, 0);
  EXPECT_GT(st.lookup.context_right, 2 * st.lookup.own_right) << st.lookup.scored << " rows scored";
  EXPECT_GT(tokens_a_round[1], 1.2 * tokens_a_round[0])
      << "tokens a round: " << tokens_a_round[0] << " own, " << tokens_a_round[1] << " with the context";
}

TEST(DflashEngine, SampledExactRowsProposeTheContextsContinuationTooAndRejectionRowsDoNot) {
  // A sampled exact-mode row's draft is accepted where it equals the target's draw, whatever
  // proposed it; on text that loops the draw follows the loop. A rejection-mode row's drafts must
  // be its own draws from q. Output identical to plain in exact mode.
  Methods m;
  auto engine = make_dflash_engine(7, &m);
  const auto prompt = encode(kLoopingPrompt);
  const auto want = plain(prompt, 96, 0.8f, 5);
  Request r = make_request(prompt, 96, 0.8f, 5);
  r.spec.method = "dflash-fixed";
  r.spec.adaptive = false;
  EXPECT_EQ(run_one(*engine, std::move(r)).tokens, want);
  const DflashStats sampled = m.fixed->stats();
  EXPECT_GT(sampled.lookup.looked_up, 0);
  EXPECT_GT(sampled.lookup.scored, 0);
  Request rejection = make_request(prompt, 96, 0.8f, 5);
  rejection.spec.method = "dflash-fixed";
  rejection.spec.adaptive = false;
  rejection.spec.mode = SpecMode::rejection;
  (void)run_one(*engine, std::move(rejection));
  EXPECT_EQ(m.fixed->stats().lookup.looked_up, sampled.lookup.looked_up);
}

TEST(DflashEngine, RejectionModeAtTemperatureZeroIsExact) {
  const auto prompt = encode(prompts()[0]);
  const auto want = plain(prompt, 40, 0, 0);
  auto engine = make_dflash_engine(5);
  Request r = make_request(prompt, 40);
  r.spec.method = "dflash";
  r.spec.mode = SpecMode::rejection;
  r.spec.adaptive = false;
  const RequestResult got = run_one(*engine, std::move(r));
  EXPECT_EQ(got.tokens, want);
  EXPECT_GT(got.stats.speculative.accepted, 0);
}

TEST(DflashEngine, RejectionModeKeepsTheDepthSoSeededRunsReproduce) {
  // The cut's lengths depend on measured times; in rejection mode the draws depend on the
  // lengths, so the cut stays out and the same seeded request gives the same tokens every run.
  Methods m;
  auto engine = make_dflash_engine(5, &m);
  std::vector<int32_t> first;
  for (int run = 0; run < 3; ++run) {
    Request r = make_request(encode(prompts()[1]), 40, 0.8f, 11);
    r.spec.method = "dflash";
    r.spec.mode = SpecMode::rejection;
    r.spec.adaptive = false;
    const RequestResult got = run_one(*engine, std::move(r));
    if (run == 0) first = got.tokens;
    EXPECT_EQ(got.tokens, first) << "run " << run;
  }
  EXPECT_GT(m.cut->stats().rounds, 0);
  EXPECT_EQ(m.cut->stats().proposed, m.cut->stats().asked);
}

TEST(DflashEngine, RejectionModeSamplesRun) {
  // Not sample-identical by design; every row must finish with its length and accept some drafts.
  auto engine = make_dflash_engine(5);
  Request r = make_request(encode(prompts()[1]), 48, 0.8f, 9);
  r.spec.method = "dflash";
  r.spec.mode = SpecMode::rejection;
  r.spec.adaptive = false;
  const RequestResult got = run_one(*engine, std::move(r));
  EXPECT_EQ(got.tokens.size(), 48u);
  EXPECT_GT(got.stats.speculative.accepted, 0);
}

TEST(DflashEngine, MixedBatchJoinAndLeave) {
  struct Spec {
    size_t prompt;
    std::string method;
    int max_tokens;
    float temperature;
  };
  const std::vector<Spec> specs = {{0, "dflash", 30, 0},      {1, "ngram", 45, 0},    {2, "dflash-fixed", 25, 0.8f},
                                   {1, "dflash", 35, 0},      {0, "draft", 20, 0.8f}, {2, "", 40, 0.8f},
                                   {1, "dflash-fixed", 30, 0}};
  std::vector<std::vector<int32_t>> want;
  for (const auto& s : specs) want.push_back(plain(encode(prompts()[s.prompt]), s.max_tokens, s.temperature, 77));
  auto engine = make_dflash_engine(6);
  std::vector<int64_t> ids(specs.size());
  auto submit = [&](size_t i) {
    const Spec& s = specs[i];
    Request r = make_request(encode(prompts()[s.prompt]), s.max_tokens, s.temperature, 77);
    r.spec.method = s.method;
    r.spec.adaptive = false;
    ids[i] = engine->submit(std::move(r));
  };
  submit(0);
  submit(1);
  submit(2);
  for (int i = 0; i < 5; ++i) engine->step();
  submit(3);
  submit(6);
  for (int i = 0; i < 8; ++i) engine->step();
  submit(4);
  submit(5);
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

TEST(DflashEngine, StopStringsInsideBursts) {
  const auto prompt = encode(prompts()[1]);
  auto engine = make_engine();
  const RequestResult full = run_one(*engine, make_request(prompt, 60));
  ASSERT_GT(full.text.size(), 40u);
  const std::string stop = full.text.substr(25, 6);
  Request base = make_request(prompt, 60);
  base.stop.stop_strings = {stop};
  const RequestResult plain_stop = run_one(*make_engine(), base);
  EXPECT_EQ(plain_stop.finish, FinishReason::stop);
  for (const char* method : {"dflash", "dflash-fixed"}) {
    for (int depth : {3, 7}) {
      auto e = make_dflash_engine(depth);
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

TEST(DflashEngine, AdaptivePolicyKeepsOutput) {
  const auto prompt = encode(prompts()[2]);
  const auto want = plain(prompt, 48, 0.8f, 5);
  auto engine = make_dflash_engine(0);
  for (const char* method : {"dflash", "dflash-fixed"}) {
    Request r = make_request(prompt, 48, 0.8f, 5);
    r.spec.method = method;
    EXPECT_EQ(run_one(*engine, std::move(r)).tokens, want) << method;
  }
}

}  // namespace
}  // namespace specdec::testing
