// The EAGLE-3 method in the engine, with the bundled head (models/eagle3): output identical to
// plain decoding at every depth, greedy and T = 0.8, alone and in batches whose rows (of every
// method) join and leave, with stop strings inside accepted bursts; rejection mode keeps the
// output length and speculates; a head whose taps do not fit the target is refused when it is
// registered.
#include <algorithm>
#include <map>
#include <numeric>

#include "api/session.h"
#include "core/error.h"
#include "engine_fixture.h"
#include "speculative/methods/eagle3.h"

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

std::shared_ptr<DraftMethod> eagle3(int depth) {
  Eagle3Options o;
  if (depth > 0) o.num_draft = depth;
  o.kv_blocks = 1024;
  return bundled_eagle3(o);
}

// The fixture's engine (ngram, draft) plus the head as "eagle3".
std::unique_ptr<EngineCore> engine_with_eagle3(int depth = 0, EngineOptions options = {}) {
  auto engine = make_engine(depth, options);
  engine->add_method("eagle3", eagle3(depth));
  return engine;
}

// A prompt after which the target's greedy text loops: argparse arguments, three a line.
std::vector<int32_t> looping_prompt() {
  return encode(
      "import argparse\nimport sys\n\n\ndef parse_args(argv=None):\n    parser = "
      "argparse.ArgumentParser(description=");
}

// One greedy request of 128 tokens after looping_prompt() on a fresh head with or without the
// context lookup, every round at the method's full depth; the method is returned for its counts.
struct LoopingRun {
  std::shared_ptr<Eagle3Method> method;
  RequestResult result;
};
LoopingRun run_looping(bool lookup) {
  Eagle3Options o;
  o.kv_blocks = 1024;
  o.context_lookup = lookup;
  LoopingRun run{bundled_eagle3(o), {}};
  auto engine = make_engine(0);
  engine->add_method("eagle3", run.method);
  Request r = make_request(looping_prompt(), 128);
  r.spec.method = "eagle3";
  r.spec.adaptive = false;
  run.result = run_one(*engine, std::move(r));
  return run;
}

struct Case {
  int depth;
  float temperature;
};

class Eagle3Identity : public ::testing::TestWithParam<Case> {};

TEST_P(Eagle3Identity, SameTokensAsPlain) {
  const Case c = GetParam();
  int64_t drafted = 0, accepted = 0;
  for (const auto& text : prompts()) {
    const auto prompt = encode(text);
    const uint64_t seed = 1234;
    const auto want = plain(prompt, 40, c.temperature, seed);
    auto engine = engine_with_eagle3(c.depth);
    Request r = make_request(prompt, 40, c.temperature, seed);
    r.spec.method = "eagle3";
    r.spec.max_depth = c.depth;
    r.spec.adaptive = false;
    const RequestResult got = run_one(*engine, std::move(r));
    EXPECT_EQ(got.tokens, want) << "depth " << c.depth << " T " << c.temperature << " prompt " << text;
    const auto& t = got.stats.speculative;
    EXPECT_LE(t.accepted, t.drafted);
    EXPECT_EQ(t.emitted, t.accepted + t.rounds);
    EXPECT_LE(t.drafted, static_cast<int64_t>(t.rounds) * c.depth);
    drafted += t.drafted;
    accepted += t.accepted;
  }
  EXPECT_GT(drafted, 0) << "never drafted";
  EXPECT_GT(accepted, 0) << "never had a draft accepted";
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int d : {1, 2, 3, 4, 6, 8, 10})
    for (float t : {0.0f, 0.8f}) out.push_back({d, t});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Depths, Eagle3Identity, ::testing::ValuesIn(cases()), [](const auto& info) {
  return "d" + std::to_string(info.param.depth) + (info.param.temperature > 0 ? "_t08" : "_greedy");
});

TEST(Eagle3Engine, AcceptsMoreThanOneTokenPerRoundOnCode) {
  // The trained head must actually predict the target: greedy on a code prompt, most rounds
  // accept drafts.
  auto engine = engine_with_eagle3(6);
  Request r = make_request(encode(prompts()[1]), 64);
  r.spec.method = "eagle3";
  r.spec.adaptive = false;
  const RequestResult got = run_one(*engine, std::move(r));
  const auto& t = got.stats.speculative;
  EXPECT_GT(static_cast<double>(t.emitted) / static_cast<double>(t.rounds), 1.5)
      << t.accepted << " accepted of " << t.drafted << " in " << t.rounds << " rounds";
}

TEST(Eagle3Engine, DraftsTokensOutsideItsVocabularyThatTheTextRepeats) {
  // The target's greedy text after this prompt loops through tokens outside the head's 4,096
  // (" help='skip" "ping'," and so on). A round emits at most one token its drafts did not
  // propose, so when the output holds more such tokens than there were rounds, some were drafted
  // (through the context rows) and accepted. Output identical to plain.
  const auto prompt = looping_prompt();
  const auto want = plain(prompt, 96, 0.0f, 0);
  auto engine = engine_with_eagle3(6);
  Request r = make_request(prompt, 96);
  r.spec.method = "eagle3";
  r.spec.adaptive = false;
  const RequestResult got = run_one(*engine, std::move(r));
  EXPECT_EQ(got.tokens, want);
  const Eagle3Head& head = *bundled_eagle3_head();
  const auto draft_ids = head.draft_to_target().first(static_cast<size_t>(head.config().draft_vocab));
  int64_t outside = 0;
  for (const int32_t t : got.tokens) outside += std::find(draft_ids.begin(), draft_ids.end(), t) == draft_ids.end();
  const auto& t = got.stats.speculative;
  EXPECT_GT(outside, t.rounds) << outside << " tokens outside the draft vocabulary in " << t.rounds << " rounds";
  EXPECT_GT(head.context_rows_used(), 0);
}

TEST(Eagle3Engine, RoundsThatCopyTheTextGoOnPastTheChain) {
  // The same looping text: once the head's whole chain of 8 is what followed its tokens earlier
  // in the text, a round goes on along the text (up to 15 drafts), and drafts past the chain are
  // accepted. Without the context lookup no round drafts past the chain. Output identical to
  // plain either way.
  const auto want = plain(looping_prompt(), 128, 0.0f, 0);
  for (const bool lookup : {true, false}) {
    const auto [method, got] = run_looping(lookup);
    EXPECT_EQ(method->default_depth(), lookup ? 15 : 8);
    EXPECT_EQ(method->own_depth(), 8);
    EXPECT_EQ(got.tokens, want) << "lookup " << lookup;
    const std::vector<int64_t>& at = got.stats.speculative.accepted_at;
    const int64_t past = at.size() > 8 ? std::accumulate(at.begin() + 8, at.end(), int64_t{0}) : 0;
    if (lookup) {
      EXPECT_GT(method->lookup_stats().extended, 0);
      EXPECT_GT(past, 0) << "no draft past the chain accepted";
    } else {
      EXPECT_EQ(method->lookup_stats().extended, 0);
      EXPECT_EQ(past, 0);
    }
  }
}

TEST(Eagle3Engine, ChainsThatLeaveTheTextTakeItsToken) {
  // The same looping text, three arguments a line: the head, which sees a few lines back, cannot
  // count them and breaks the line at the wrong argument, where the text's latest long match
  // breaks it where the target does. With the lookup, the text's token replaces the head's where
  // they part, the text is right there more often than the head, and rounds are longer than
  // without it (every round drafts the whole chain). Output identical to plain either way.
  const auto want = plain(looping_prompt(), 128, 0.0f, 0);
  double mean_length[2] = {0, 0};
  for (const bool lookup : {true, false}) {
    const auto [method, got] = run_looping(lookup);
    EXPECT_EQ(got.tokens, want) << "lookup " << lookup;
    const auto& s = got.stats.speculative;
    ASSERT_GT(s.rounds, 0);
    mean_length[lookup] = s.mean_accepted_length();
    const LookupStats& l = method->lookup_stats();
    if (lookup) {
      EXPECT_GT(l.looked_up, 0);
      EXPECT_GT(l.context_right, l.own_right) << l.scored << " scored";
    } else {
      EXPECT_EQ(l.looked_up + l.scored, 0);
    }
  }
  EXPECT_GT(mean_length[1], mean_length[0] + 0.25);
}

TEST(Eagle3Engine, MixedBatchJoinAndLeave) {
  // EAGLE-3 rows beside rows of the other methods and plain rows, joining and leaving mid-run
  // (so the head's rows are filtered and appended around live ones); each row gives its solo
  // plain output.
  struct Spec {
    size_t prompt;
    std::string method;
    int max_tokens;
    float temperature;
  };
  const std::vector<Spec> specs = {{0, "eagle3", 30, 0},    {1, "ngram", 45, 0},    {2, "eagle3", 25, 0.8f},
                                   {1, "eagle3", 50, 0},    {0, "draft", 20, 0.8f}, {2, "", 40, 0.8f},
                                   {1, "eagle3", 35, 0.8f}, {0, "eagle3", 12, 0}};
  std::vector<std::vector<int32_t>> want;
  for (const auto& s : specs) want.push_back(plain(encode(prompts()[s.prompt]), s.max_tokens, s.temperature, 77));

  auto engine = engine_with_eagle3(4);
  std::map<size_t, int64_t> ids;
  auto submit = [&](size_t i) {
    const Spec& s = specs[i];
    Request r = make_request(encode(prompts()[s.prompt]), s.max_tokens, s.temperature, 77);
    r.spec.method = s.method;
    r.spec.adaptive = false;
    ids[i] = engine->submit(std::move(r));
  };
  for (size_t i : {0, 1, 2}) submit(i);
  for (int i = 0; i < 5; ++i) engine->step();
  for (size_t i : {3, 7}) submit(i);
  for (int i = 0; i < 9; ++i) engine->step();
  for (size_t i : {4, 5, 6}) submit(i);
  engine->run();
  for (size_t i = 0; i < specs.size(); ++i) {
    auto res = engine->take_result(ids.at(i));
    ASSERT_TRUE(res.has_value());
    EXPECT_EQ(res->tokens, want[i]) << "row " << i << " method '" << specs[i].method << "'";
    if (specs[i].method == "eagle3") {
      EXPECT_GT(res->stats.speculative.drafted, 0) << "row " << i;
    }
  }
}

TEST(Eagle3Engine, StopStringsInsideBursts) {
  const auto prompt = encode(prompts()[1]);
  const RequestResult full = run_one(*make_engine(), make_request(prompt, 60));
  ASSERT_GT(full.text.size(), 40u);
  const std::string stop = full.text.substr(25, 6);
  Request base = make_request(prompt, 60);
  base.stop.stop_strings = {stop};
  const RequestResult plain_stop = run_one(*make_engine(), base);
  ASSERT_EQ(plain_stop.finish, FinishReason::stop);
  for (int depth : {4, 10}) {
    auto e = engine_with_eagle3(depth);
    Request r = base;
    r.spec.method = "eagle3";
    r.spec.adaptive = false;
    const RequestResult got = run_one(*e, std::move(r));
    EXPECT_GT(got.stats.speculative.accepted, 0) << "depth " << depth;
    EXPECT_EQ(got.tokens, plain_stop.tokens) << "depth " << depth;
    EXPECT_EQ(got.text, plain_stop.text);
    EXPECT_EQ(got.finish, FinishReason::stop);
  }
}

TEST(Eagle3Engine, AdaptivePolicyKeepsOutput) {
  const auto prompt = encode(prompts()[0]);
  const auto want = plain(prompt, 48, 0, 0);
  auto engine = engine_with_eagle3();
  Request r = make_request(prompt, 48);
  r.spec.method = "eagle3";
  EXPECT_EQ(run_one(*engine, std::move(r)).tokens, want);
}

TEST(Eagle3Engine, RejectionModeSpeculates) {
  // Rejection sampling keeps the distribution, not the sample: the run completes at full
  // length, proposes with q over the target vocabulary and accepts some drafts.
  auto engine = engine_with_eagle3(4);
  for (float t : {0.0f, 0.8f}) {
    Request r = make_request(encode(prompts()[1]), 40, t, 5);
    r.spec.method = "eagle3";
    r.spec.mode = SpecMode::rejection;
    r.spec.adaptive = false;
    const RequestResult got = run_one(*engine, std::move(r));
    EXPECT_EQ(got.tokens.size(), 40u);
    EXPECT_GT(got.stats.speculative.accepted, 0) << "T " << t;
    if (t == 0.0f) {
      EXPECT_EQ(got.tokens, plain(encode(prompts()[1]), 40, 0, 5));  // greedy: one-hot p
    }
  }
}

TEST(Eagle3Engine, SeededRejectionModeIgnoresWhatOtherRequestsLeftInTheContextRows) {
  // The context rows hold what every row of the drafter has seen; a rejection-mode row's output
  // follows its drafts' distribution, so it draws from the draft vocabulary alone and a seeded
  // request gives the same tokens whether or not a request before it filled the rows (here the
  // same prompt greedily: the tokens outside the draft vocabulary that this text loops through).
  const auto prompt = looping_prompt();
  const auto run = [&](bool after_other) {
    auto engine = engine_with_eagle3(4);
    if (after_other) {
      Request other = make_request(prompt, 64);
      other.spec.method = "eagle3";
      run_one(*engine, std::move(other));
      EXPECT_GT(bundled_eagle3_head()->context_rows_used(), 0);
    }
    std::vector<std::vector<int32_t>> out;
    for (uint64_t seed : {3, 9, 27}) {
      Request r = make_request(prompt, 48, 0.8f, seed);
      r.spec.method = "eagle3";
      r.spec.mode = SpecMode::rejection;
      r.spec.adaptive = false;
      out.push_back(run_one(*engine, std::move(r)).tokens);
    }
    return out;
  };
  EXPECT_EQ(run(true), run(false));
}

TEST(Eagle3Engine, HeadForAnotherTargetIsRefused) {
  // The fixture head is for a target of 96 tokens whose taps are 24 wide.
  std::shared_ptr<Eagle3Head> head =
      Eagle3Head::load(source_path("tests/fixtures/eagle3/head"), *Bundled::get().backend);
  auto engine = make_engine();
  try {
    engine->add_method("tiny", std::make_shared<Eagle3Method>(head, "tiny", 8));
    FAIL() << "registered a head for another target";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("the EAGLE-3 head tiny has vocab_size 96 but the target's vocabulary has 8192"),
        std::string::npos)
        << e.what();
  }
}

TEST(Eagle3Engine, DraftFolderPicksTheMethodFromItsConfig) {
  // --draft DIR: a folder whose config.json names LlamaForCausalLMEagle3 is an EAGLE-3 head
  // (loaded once however often it is named), any other a draft model.
  EngineConfig config;
  config.model_dir = source_path("models/target");
  config.device = DeviceKind::cpu;
  Session session = open_session(config);
  const auto head = make_draft_method(session, DraftSpec::model(source_path("models/eagle3"), {}, 5));
  EXPECT_EQ(head->name(), "eagle3");
  EXPECT_EQ(head->default_depth(), 5);
  // The bundled head names its taps in config.json (eagle_aux_hidden_state_layer_ids).
  EXPECT_EQ(head->needs().tap_layers, (std::vector<int>{1, 4, 6}));
  EXPECT_TRUE(head->needs().embedding);
  make_draft_method(session, DraftSpec::model(source_path("models/eagle3")));
  EXPECT_EQ(session.eagle3_heads.size(), 1u);
  EXPECT_TRUE(session.draft_models.empty());
  EXPECT_EQ(make_draft_method(session, DraftSpec::model(source_path("models/draft")))->name(), "draft");
}

}  // namespace
}  // namespace specdec::testing
