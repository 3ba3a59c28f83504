// The engine over the prefix cache: a request whose prompt begins like an earlier one's starts
// past the shared blocks and produces exactly the tokens it produces on a fresh engine, plainly
// and with each draft method (n-gram and the draft model still learn the whole prompt; the
// hidden-state drafters read taps from the first position the row computes); the cache's blocks
// all come back when the rows are done.
#include "engine_fixture.h"

namespace specdec::testing {
namespace {

const std::string kShared =
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n"
    "    def peek(self):\n        return self.items[-1]\n\n";

// The fixture's engine (ngram, draft) plus the two hidden-state drafters, "eagle3" and "dflash".
std::unique_ptr<EngineCore> engine_with_all(int depth, EngineOptions options = {}) {
  auto engine = make_engine(depth, options);
  Eagle3Options e;
  e.num_draft = depth;
  e.kv_blocks = 1024;
  engine->add_method("eagle3", bundled_eagle3(e));
  DflashOptions d;
  d.num_draft = depth;
  engine->add_method("dflash", bundled_dflash(d));
  return engine;
}

std::vector<int32_t> fresh(const std::vector<int32_t>& prompt, int n, const std::string& method) {
  EngineOptions options;
  options.prefix_cache = false;
  auto engine = engine_with_all(4, options);
  Request r = make_request(prompt, n);
  r.spec.method = method;
  r.spec.adaptive = false;
  return run_one(*engine, std::move(r)).tokens;
}

TEST(PrefixSharing, SecondRequestSkipsTheSharedBlocksAndKeepsItsTokens) {
  const auto first = encode(kShared + "    def size(self):\n");
  const auto second = encode(kShared + "    def is_empty(self):\n");
  ASSERT_GT(first.size(), 50u);
  // The hidden-state drafters get no taps for the shared positions: their context starts with a
  // gap, and they still draft (and are accepted) from the positions the row computes.
  for (const std::string method : {"", "ngram", "draft", "eagle3", "dflash"}) {
    auto engine = engine_with_all(4);
    Request a = make_request(first, 24);
    a.spec.method = method;
    a.spec.adaptive = false;
    EXPECT_EQ(run_one(*engine, std::move(a)).tokens, fresh(first, 24, method)) << method;
    const int64_t hits_before = engine->kv().prefix_hit_tokens();
    Request b = make_request(second, 24);
    b.spec.method = method;
    b.spec.adaptive = false;
    const RequestResult got = run_one(*engine, std::move(b));
    EXPECT_EQ(got.tokens, fresh(second, 24, method)) << method;
    // Whole 16-token blocks of the common prefix were shared.
    EXPECT_GE(engine->kv().prefix_hit_tokens() - hits_before, 32) << method;
    if (!method.empty()) {
      EXPECT_GT(got.stats.speculative.accepted, 0) << method;
    }
    EXPECT_EQ(engine->kv().free_blocks(), engine->kv().total_blocks());
  }
}

TEST(PrefixSharing, RejectionModeRowsOfHiddenStateDraftersComputeTheirWholePrompt) {
  // Their tokens depend on the drafts, which a drafter missing the shared positions would draft
  // otherwise: the row takes no cached block, and the seeded request repeats its output.
  const auto prompt = encode(kShared + "    def size(self):\n");
  for (const std::string method : {"eagle3", "dflash"}) {
    auto engine = engine_with_all(4);
    const auto request = [&] {
      Request r = make_request(prompt, 24, 0.8f, 7);
      r.spec.method = method;
      r.spec.mode = SpecMode::rejection;
      r.spec.adaptive = false;
      return r;
    };
    const RequestResult first = run_one(*engine, request());
    const int64_t hits_before = engine->kv().prefix_hit_tokens();
    const RequestResult again = run_one(*engine, request());
    EXPECT_EQ(engine->kv().prefix_hit_tokens(), hits_before) << method;
    EXPECT_EQ(again.tokens, first.tokens) << method;
    EXPECT_GT(again.stats.speculative.drafted, 0) << method;
  }
}

TEST(PrefixSharing, ConcurrentRowsWithOneDecodedPrefixMatchFreshRuns) {
  // The first request's generated text becomes part of the next prompts: blocks filled by decode
  // steps (and verify windows) are shared as well as prompt blocks.
  auto engine = engine_with_all(4);
  const auto base = encode(kShared);
  const RequestResult seed_run = run_one(*engine, make_request(base, 40));
  std::vector<int32_t> extended = base;
  extended.insert(extended.end(), seed_run.tokens.begin(), seed_run.tokens.end());
  std::vector<int64_t> ids;
  std::vector<std::vector<int32_t>> want;
  const std::vector<std::string> methods = {"eagle3", "ngram", "draft", "dflash"};
  for (size_t i = 0; i < methods.size(); ++i) {
    std::vector<int32_t> p(extended.begin(), extended.end() - static_cast<std::ptrdiff_t>(i * 3));
    want.push_back(fresh(p, 20, methods[i]));
    Request r = make_request(p, 20);
    r.spec.method = methods[i];
    r.spec.adaptive = false;
    ids.push_back(engine->submit(std::move(r)));
  }
  engine->run();
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(engine->take_result(ids[i])->tokens, want[i]) << "row " << i;
  EXPECT_GE(engine->kv().prefix_hit_tokens(), 4 * 64);
  EXPECT_EQ(engine->kv().free_blocks(), engine->kv().total_blocks());
}

}  // namespace
}  // namespace specdec::testing
