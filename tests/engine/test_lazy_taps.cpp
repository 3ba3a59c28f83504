// The hidden-state drafters take the target's taps every round but do their own work on them only
// in rounds in which a row drafts. These tests drive the bundled EAGLE-3 head and DFlash drafter
// through their seam with the bundled target's real taps, round by round, and check that a row
// that skipped drafting for several rounds (and so catches up on all of them at once) proposes
// exactly what a row that drafted, and so took its context in, every round proposes, and what a
// fresh row given the whole prefix as one prefill block proposes: after rounds that accepted
// nothing or several drafts, across earlier chained guesses that must be cut off, across a
// checkpoint taken while taps were still waiting, and past the bound on waiting taps.
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>

#include "engine_fixture.h"
#include "speculative/methods/dflash.h"
#include "speculative/methods/eagle3.h"

namespace specdec::testing {
namespace {

// The taps of every position of one token sequence, in buffers of the backend that outlive
// every target forward.
struct Taps {
  std::vector<int32_t> tokens;
  std::vector<Buffer> buffers;
  std::vector<Tensor> views;  // per tap layer, [tokens, hidden]

  TargetContext at(int64_t from, int64_t count) const {
    TargetContext c;
    for (const Tensor& v : views) c.taps.push_back(v.rows(from, count));
    return c;
  }
};

// A code prompt and the bundled target's greedy continuation, `repeat` times over.
Taps reference_taps(const std::vector<int>& layers, int repeat = 1) {
  Bundled& b = Bundled::get();
  std::vector<int32_t> once =
      encode("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self):\n");
  auto engine = make_engine();
  const auto more = run_one(*engine, make_request(once, 64)).tokens;
  once.insert(once.end(), more.begin(), more.end());
  std::vector<int32_t> tokens;
  for (int i = 0; i < repeat; ++i) tokens.insert(tokens.end(), once.begin(), once.end());
  Model& target = *b.target;
  auto cache = target.make_cache(static_cast<int>(tokens.size()) / 16 + 2);
  const auto seq = cache->create();
  const int n = static_cast<int>(tokens.size());
  EXPECT_TRUE(cache->reserve(seq, n));
  SequenceInput in{seq, tokens, {}};
  in.taps_at.resize(static_cast<size_t>(n));
  std::iota(in.taps_at.begin(), in.taps_at.end(), 0);
  const ForwardResult out = target.forward(ForwardRequest{{in}, layers}, *cache);
  Taps t;
  t.tokens = tokens;
  for (const int layer : layers) {
    const auto j = std::find(out.tap_layers.begin(), out.tap_layers.end(), layer) - out.tap_layers.begin();
    const Tensor& src = out.taps.at(static_cast<size_t>(j));
    t.buffers.push_back(target.backend().allocate(src.bytes()));
    t.views.push_back(t.buffers.back().view(DType::f32, {src.dim(0), src.dim(1)}));
    target.backend().copy(src, t.views.back());
  }
  target.backend().synchronize();
  return t;
}

TargetView view() {
  const Model& target = *Bundled::get().target;
  TargetView v;
  v.model = &target;
  v.vocab_size = target.config().vocab_size;
  v.hidden_size = target.config().hidden_size;
  v.num_layers = target.config().num_layers;
  v.max_rows = 8;
  v.taps = true;
  v.embedding = &target.embedding();
  v.lm_head = &target.lm_head();
  return v;
}

// One row of a group, replaying the sequence: `at` is its pending token's position.
struct Cursor {
  int row = 0;
  int64_t at = 0;
};

class LazyTaps : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    // The drafter's own drafts: the request's text's lookup keeps a score per row that rows
    // drafting at different rounds set differently (context_lookup.h).
    const std::string which = GetParam();
    if (which == "eagle3") {
      Eagle3Options o;
      o.num_draft = 4;
      o.kv_blocks = 512;
      o.context_lookup = false;
      method_ = bundled_eagle3(o);
    } else {
      DflashOptions o;
      o.confidence_cut = false;
      o.kv_blocks = 512;
      o.context_lookup = false;
      method_ = bundled_dflash(o);
    }
    depth_ = method_->default_depth();
    greedy_.temperature = 0;
    warm_.temperature = 0.8f;
    warm_.seed = 7;
  }

  std::unique_ptr<DraftRows> open_rows(int n) {
    auto rows = method_->open(view());
    std::vector<const Checkpoint*> fresh(static_cast<size_t>(n), nullptr);
    rows->prepare_append(fresh).commit();
    return rows;
  }

  // Prefills [0, to) in blocks of `block`, leaving token `to` pending.
  void prefill(DraftRows& rows, Cursor& c, const Taps& t, int64_t to, int64_t block) {
    for (int64_t p = 0; p < to; p += block) {
      const int64_t n = std::min(block, to - p);
      rows.prefill(c.row, std::span<const int32_t>(t.tokens.data() + p, static_cast<size_t>(n)), t.at(p, n));
    }
    c.at = to;
  }

  // A round that accepted `accepted` drafts (of `drafted`): its pending token and those drafts
  // are verified, and the next token is pending.
  static void commit(DraftRows& rows, Cursor& c, const Taps& t, int accepted, int drafted) {
    RowCommit rc;
    rc.row = c.row;
    rc.pending = t.tokens[static_cast<size_t>(c.at)];
    rc.accepted = accepted;
    rc.drafted = drafted;
    rc.emitted.assign(t.tokens.begin() + c.at + 1, t.tokens.begin() + c.at + accepted + 2);
    rc.context = t.at(c.at, accepted + 1);
    rows.commit(std::span<const RowCommit>(&rc, 1));
    c.at += accepted + 1;
  }

  DraftProposal draft(DraftRows& rows, const Cursor& c, const Taps& t, const SamplingParams& sampling, bool want_q) {
    DraftRequestRow ask{c.row, t.tokens[static_cast<size_t>(c.at)], depth_, c.at, &sampling, want_q};
    auto got = rows.draft(std::span<const DraftRequestRow>(&ask, 1));
    return got.at(0);
  }

  // Each of `rows` drafts once (a row drafts at most once a round), greedy or at T = 0.8 with
  // the distributions; all must propose what the first proposes. With `fresh`, a new row given
  // the first's history [0, at) as one prefill block (the eager reference of any history) joins.
  void expect_same_drafts(std::vector<std::pair<DraftRows*, Cursor>> rows, const Taps& t, bool warm, bool fresh,
                          const std::string& where) {
    std::unique_ptr<DraftRows> once;
    if (fresh) {
      once = open_rows(1);
      Cursor f;
      prefill(*once, f, t, rows.front().second.at, rows.front().second.at);
      rows.emplace_back(once.get(), f);
    }
    const SamplingParams& s = warm ? warm_ : greedy_;
    const DraftProposal x = draft(*rows.front().first, rows.front().second, t, s, warm);
    ASSERT_FALSE(x.tokens.empty()) << where;
    for (size_t k = 1; k < rows.size(); ++k) {
      ASSERT_EQ(rows[k].second.at, rows.front().second.at);
      const DraftProposal y = draft(*rows[k].first, rows[k].second, t, s, warm);
      const std::string what = where + (warm ? " at T 0.8" : " greedy") + ", against row " + std::to_string(k);
      EXPECT_EQ(x.tokens, y.tokens) << what;
      ASSERT_EQ(x.q.size(), y.q.size()) << what;
      for (size_t i = 0; i < x.q.size(); ++i) {
        ASSERT_EQ(x.q[i].size(), y.q[i].size());
        double worst = 0;
        for (size_t v = 0; v < x.q[i].size(); ++v)
          worst = std::max(worst, std::abs(static_cast<double>(x.q[i][v]) - y.q[i][v]));
        // The CPU computes a position the same however many come in one call; a GPU's kernels
        // may split a call of many positions differently from one of a few.
        EXPECT_LE(worst, test_on_gpu() ? 1e-4 : 0.0) << what << ", draft " << i << "'s distribution";
      }
    }
  }

  std::shared_ptr<DraftMethod> method_;
  int depth_ = 0;
  SamplingParams greedy_, warm_;
};

TEST_P(LazyTaps, CatchingUpEqualsTakingTheContextEveryRound) {
  const Taps t = reference_taps(method_->needs().tap_layers);
  // Row 0 drafts every round (its context is taken in every round); row 1 only now and then.
  auto rows = open_rows(2);
  Cursor eager{0, 0}, lazy{1, 0};
  prefill(*rows, eager, t, 20, 7);
  prefill(*rows, lazy, t, 20, 7);
  const std::vector<int> accepted = {0, 2, 1, 3, 0, 0, 4, 1, 0, 2, 2, 0, 3, 1, 0, 0, 1, 2};
  const std::set<size_t> lazy_drafts = {7, 8, 13};  // rounds (before their commit) in which row 1 drafts
  for (size_t round = 0; round < accepted.size(); ++round) {
    if (lazy_drafts.count(round)) {
      // Paused since the prefill (or since its last draft, whose chained guesses it must drop).
      expect_same_drafts({{rows.get(), lazy}, {rows.get(), eager}}, t, round % 2 == 0, true,
                         "round " + std::to_string(round));
    } else {
      draft(*rows, eager, t, greedy_, false);
    }
    commit(*rows, eager, t, accepted[round], depth_);
    commit(*rows, lazy, t, accepted[round], lazy_drafts.count(round) ? depth_ : 0);
  }
  expect_same_drafts({{rows.get(), lazy}, {rows.get(), eager}}, t, true, true, "the end");
}

TEST_P(LazyTaps, RowsCatchUpTogetherInOneCall) {
  // Three rows paused for different spans draft in one call: each as if alone.
  const Taps t = reference_taps(method_->needs().tap_layers);
  auto rows = open_rows(3);
  std::vector<Cursor> c = {{0, 0}, {1, 0}, {2, 0}};
  for (auto& x : c) prefill(*rows, x, t, 16, 16);
  for (int round = 0; round < 9; ++round)
    for (size_t i = 0; i < c.size(); ++i)
      if (round < 3 * static_cast<int>(i + 1)) commit(*rows, c[i], t, (round + static_cast<int>(i)) % 3, 0);
  std::vector<DraftRequestRow> asks;
  for (const auto& x : c) asks.push_back({x.row, t.tokens[static_cast<size_t>(x.at)], depth_, x.at, &greedy_, false});
  const auto together = rows->draft(asks);
  for (size_t i = 0; i < c.size(); ++i) {
    auto alone = open_rows(1);
    Cursor a;
    prefill(*alone, a, t, c[i].at, 5);
    const DraftProposal want = draft(*alone, a, t, greedy_, false);
    EXPECT_EQ(together[i].tokens, want.tokens) << "row " << i;
    EXPECT_GT(together[i].caught_up, 0) << "row " << i << " caught up on several rounds";
  }
}

TEST_P(LazyTaps, CheckpointWithWaitingTapsRestores) {
  // A row captured while taps of rounds it did not draft in still wait, restored into another
  // group, drafts as the original; and a row rolled back to that checkpoint after it went on
  // drafting and committing drafts as it did then.
  const Taps t = reference_taps(method_->needs().tap_layers);
  auto rows = open_rows(1);
  Cursor c;
  prefill(*rows, c, t, 18, 6);
  commit(*rows, c, t, 2, 0);
  draft(*rows, c, t, greedy_, false);
  for (const int a : {1, 0, 3}) commit(*rows, c, t, a, 0);
  const Checkpoint cp = rows->capture(0);
  const Cursor then = c;
  const DraftProposal before = draft(*rows, c, t, greedy_, false);
  for (const int a : {2, 0, 1}) commit(*rows, c, t, a, depth_);

  auto other = method_->open(view());
  const Checkpoint* restored = &cp;
  other->prepare_append(std::span<const Checkpoint* const>(&restored, 1)).commit();
  Cursor r{0, then.at};
  if (std::string(GetParam()) == "eagle3") {
    // An EAGLE-3 row restores its tokens only: the head starts after them, from the next taps.
    EXPECT_TRUE(draft(*other, r, t, greedy_, false).tokens.empty());
    return;
  }
  EXPECT_EQ(draft(*other, r, t, greedy_, false).tokens, before.tokens);
  for (const int a : {2, 0, 1}) commit(*other, r, t, a, 0);
  expect_same_drafts({{other.get(), r}, {rows.get(), c}}, t, true, true, "after the restored row's rounds");
}

TEST_P(LazyTaps, LongPausesStayBounded) {
  // Past the bound on waiting taps a commit takes them in without a draft call; what the row
  // drafts afterwards does not change.
  const Taps t = reference_taps(method_->needs().tap_layers, 12);
  ASSERT_GT(t.tokens.size(), 700u);
  // Row 0 passes the bound in its rounds, row 1 already in its prompt.
  auto rows = open_rows(2);
  std::vector<Cursor> c = {{0, 0}, {1, 0}};
  prefill(*rows, c[0], t, 100, 50);
  prefill(*rows, c[1], t, 700, 64);
  for (Cursor& x : c) {
    int round = 0;
    while (x.at + 8 < static_cast<int64_t>(t.tokens.size())) commit(*rows, x, t, round++ % 4, 0);
    expect_same_drafts({{rows.get(), x}}, t, x.row == 1, true,
                       "row " + std::to_string(x.row) + " after " + std::to_string(round) + " rounds");
  }
}

// A round the target did not tap (the engine skips a row its depth policy keeps from drafting).
void commit_untapped(DraftRows& rows, Cursor& c, const Taps& t) {
  RowCommit rc;
  rc.row = c.row;
  rc.pending = t.tokens[static_cast<size_t>(c.at)];
  rc.emitted = {t.tokens[static_cast<size_t>(c.at + 1)]};
  rows.commit(std::span<const RowCommit>(&rc, 1));
  c.at += 1;
}

TEST_P(LazyTaps, AGapDraftsTheSameWhetherTapsWaitedAcrossItOrNot) {
  // Row 0 drafts just before a run of untapped rounds (its context takes in every position
  // before them), row 1 last drafted long before (its taps of the positions before the gap
  // still wait when the gap comes, and are taken in after it): the same context either way,
  // so the same drafts, and again after a second gap. A row captured while taps wait across a
  // gap restores into another group and drafts the same.
  const Taps t = reference_taps(method_->needs().tap_layers);
  auto rows = open_rows(2);
  Cursor eager{0, 0}, lazy{1, 0};
  prefill(*rows, eager, t, 20, 7);
  prefill(*rows, lazy, t, 20, 7);
  for (const int gap : {5, 9}) {
    for (const int a : {2, 0, 1}) {
      draft(*rows, eager, t, greedy_, false);
      commit(*rows, eager, t, a, depth_);
      commit(*rows, lazy, t, a, 0);
    }
    for (int i = 0; i < gap; ++i) {
      commit_untapped(*rows, eager, t);
      commit_untapped(*rows, lazy, t);
    }
    for (const int a : {1, 0}) {
      commit(*rows, eager, t, a, 0);
      commit(*rows, lazy, t, a, 0);
    }
    if (gap == 9 && std::string(GetParam()) == "dflash") {
      const Checkpoint cp = rows->capture(1);
      auto other = method_->open(view());
      const Checkpoint* restored = &cp;
      other->prepare_append(std::span<const Checkpoint* const>(&restored, 1)).commit();
      expect_same_drafts({{rows.get(), eager}, {other.get(), Cursor{0, lazy.at}}}, t, true, false,
                         "restored across the gap");
    }
    expect_same_drafts({{rows.get(), lazy}, {rows.get(), eager}}, t, gap == 9, false,
                       "after a gap of " + std::to_string(gap));
  }
}

TEST_P(LazyTaps, AProbeAfterAGapIsAcceptedAboutAsOften) {
  // A pause whose rounds went untapped but for the last ones the method asks for
  // (TargetNeeds::resume_taps) ends in a probe of one draft, whose outcome decides whether the
  // row drafts again: checked against the target's own continuation, the first draft over the
  // gap is accepted about as often as with every position in the context.
  const Taps t = reference_taps(method_->needs().tap_layers, 2);
  const int gap = 24, lead = method_->needs().resume_taps;
  int64_t first_gap = 0, first_full = 0, rounds = 0;
  double mean_gap = 0, mean_full = 0;
  for (int64_t at = 60; at + depth_ + 1 < static_cast<int64_t>(t.tokens.size()); at += 3) {
    for (const bool whole : {false, true}) {
      auto rows = open_rows(1);
      Cursor c;
      prefill(*rows, c, t, at - gap - lead - 1, 16);
      draft(*rows, c, t, greedy_, false);
      commit(*rows, c, t, 0, depth_);
      while (c.at < at) {
        if (whole || c.at >= at - lead)
          commit(*rows, c, t, 0, 0);
        else
          commit_untapped(*rows, c, t);
      }
      const DraftProposal p = draft(*rows, c, t, greedy_, false);
      ASSERT_FALSE(p.tokens.empty()) << "at " << at;
      int accepted = 0;
      while (accepted < static_cast<int>(p.tokens.size()) &&
             p.tokens[static_cast<size_t>(accepted)] == t.tokens[static_cast<size_t>(at + 1 + accepted)])
        ++accepted;
      (whole ? first_full : first_gap) += accepted > 0;
      (whole ? mean_full : mean_gap) += accepted;
    }
    ++rounds;
  }
  ASSERT_GT(rounds, 30);
  std::printf("%s: first draft accepted %.2f over a gap (%.2f with the whole context); %.2f of %d drafts (%.2f)\n",
              GetParam(), static_cast<double>(first_gap) / rounds, static_cast<double>(first_full) / rounds,
              mean_gap / rounds, depth_, mean_full / rounds);
  EXPECT_GT(first_full, rounds / 2);
  EXPECT_GE(first_gap, 0.8 * first_full);
}

INSTANTIATE_TEST_SUITE_P(Eagle3AndDflash, LazyTaps, ::testing::Values("eagle3", "dflash"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace specdec::testing
