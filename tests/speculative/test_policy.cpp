// The depth policy's cost fit and choices: it recovers a linear forward cost, a lone timing
// spike does not derail it (nor pause speculation), a lasting change of cost is still learned,
// and the depth follows acceptance (deep when drafts are accepted, paused when they are not,
// and predicted from whether the previous round was accepted whole).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "speculative/policy.h"

namespace specdec {
namespace {

constexpr double kFixed = 0.68e-3, kPerToken = 0.22e-3;  // a plain step of 0.9 ms

double truth(int tokens, double scale = 1.0) { return scale * (kFixed + kPerToken * tokens); }

CostModel calibrated_model() {
  CostModel costs;
  for (int i = 0; i < 40; ++i) {
    const int tokens = i % 2 == 0 ? 1 : 11;
    costs.observe_forward(tokens, truth(tokens));
  }
  return costs;
}

// The bundled target's forwards on a CPU, widths 1-9 (measured, ms): a plain step 0.65 ms,
// windows of up to three tokens nearly as cheap, then ~0.15 ms a token.
constexpr double kCpuWindowMs[] = {0, 0.648, 0.685, 0.788, 0.986, 1.118, 1.246, 1.458, 1.556, 1.824};

// Those forwards, each `slowdown` times as long (other load on the cores).
CostModel cpu_window_model(double slowdown = 1.0) {
  CostModel costs;
  for (int i = 0; i < 90; ++i) costs.observe_forward(1 + i % 9, slowdown * kCpuWindowMs[1 + i % 9] * 1e-3);
  return costs;
}

// A target step on a GPU: 0.26 ms, 3 us a token more, seen at widths 1-4.
CostModel gpu_step_model() {
  CostModel costs;
  for (int i = 0; i < 40; ++i) {
    const int tokens = 1 + i % 4;
    costs.observe_forward(tokens, 0.26e-3 + 3e-6 * tokens);
  }
  return costs;
}

// A draft model's calls: 0.06 ms whatever the depth plus 0.115 ms a step, seen at depths 1 and 3.
DraftCost draft_model_calls() {
  DraftCost draft;
  for (int i = 0; i < 40; ++i) {
    const int depth = i % 2 == 0 ? 1 : 3;
    draft.observe(depth, (0.06 + 0.115 * depth) * 1e-3);
  }
  return draft;
}

TEST(CostModel, RecoversALinearCost) {
  const CostModel costs = calibrated_model();
  ASSERT_TRUE(costs.calibrated());
  EXPECT_NEAR(costs.row_cost(1, 1), truth(1), 1e-6);
  EXPECT_NEAR(costs.row_cost(11, 1), truth(11), 1e-6);
}

TEST(CostModel, ALoneSpikeMovesTheFitLittle) {
  CostModel costs = calibrated_model();
  costs.observe_forward(1, 0.030);  // a 30 ms stall of a 0.9 ms step
  EXPECT_LT(costs.row_cost(1, 1), 1.3 * truth(1));
  EXPECT_LT(costs.row_cost(11, 1), 1.3 * truth(11));
}

TEST(CostModel, ALastingChangeIsLearned) {
  CostModel costs = calibrated_model();
  for (int i = 0; i < 60; ++i) {
    const int tokens = i % 2 == 0 ? 1 : 11;
    costs.observe_forward(tokens, truth(tokens, 3.0));
  }
  EXPECT_NEAR(costs.row_cost(1, 1), truth(1, 3.0), 0.1 * truth(1, 3.0));
  EXPECT_NEAR(costs.row_cost(11, 1), truth(11, 3.0), 0.1 * truth(11, 3.0));
}

TEST(CostModel, KeepsTheSlopeThroughALongRunOfPlainSteps) {
  // Speculation paused: hundreds of one-token steps, then one probe whose timing is 20 % off.
  // The slope learned from the windows must survive both.
  CostModel costs = calibrated_model();
  for (int i = 0; i < 300; ++i) costs.observe_forward(1, truth(1));
  costs.observe_forward(2, 1.2 * truth(2));
  EXPECT_NEAR(costs.row_cost(1, 1), truth(1), 0.05 * truth(1));
  EXPECT_NEAR(costs.row_cost(11, 1), truth(11), 0.1 * truth(11));
}

// A CPU-like forward: up to three tokens stream the weights at the price of one, every token
// after that adds its compute.
double kneed(int tokens) { return 0.8e-3 + 0.18e-3 * std::max(0, tokens - 3); }

CostModel kneed_model() {
  CostModel costs;
  for (int i = 0; i < 60; ++i) {
    const int tokens = 1 + i % 8;
    costs.observe_forward(tokens, kneed(tokens));
  }
  return costs;
}

TEST(CostModel, PricesEachWidthAsMeasured) {
  const CostModel costs = kneed_model();
  for (int w = 1; w <= 8; ++w) EXPECT_NEAR(costs.row_cost(w, 1), kneed(w), 1e-9) << "width " << w;
  // Widths never measured: the nearest measured one below plus the fitted slope.
  EXPECT_GT(costs.row_cost(12, 1), costs.row_cost(8, 1));
  EXPECT_LT(costs.row_cost(12, 1), 2.0 * kneed(12));
}

TEST(CostModel, SlowFirstForwardsDoNotSetACountsPrice) {
  // A GPU's replayed step: its first forwards run call by call and then record (0.19 and 0.52
  // ms), every later one takes 0.15 ms. A mean of the first five priced it at 0.23 ms; a row
  // that then drafted every round never measured it again.
  CostModel costs;
  for (double ms : {0.19, 0.52, 0.15, 0.15, 0.15}) costs.observe_forward(1, ms * 1e-3);
  EXPECT_LT(costs.row_cost(1, 1), 0.16e-3);
}

TEST(CostModel, ACountsFirstForwardDoesNotPriceIt) {
  // A fresh engine's first window of four tokens ran at twice its cost (page faults in grown
  // buffers). Priced by that figure, depth three looked dear and was not chosen again, so the
  // figure stood; a count measured once is priced from the counts below it instead.
  CostModel costs;
  costs.observe_forward(4, 2.0 * kneed(4));
  for (int i = 0; i < 200; ++i) {
    const int tokens = i % 2 == 0 ? 3 : 8;
    costs.observe_forward(tokens, kneed(tokens));
  }
  EXPECT_LT(costs.row_cost(4, 1), 1.25 * kneed(4));
  // Nor do its first few: an engine's first iterations may all be slow, and a row that prices
  // the window by them drafts shallower for good. Until its fifth forward a count is priced at
  // most as the settled count below it extrapolates; from then on as measured, the lower median
  // of its first five.
  for (const double f : {1.3, 1.4, 1.2}) {
    costs.observe_forward(4, f * kneed(4));
    EXPECT_LT(costs.row_cost(4, 1), 1.05 * kneed(4)) << f;
  }
  costs.observe_forward(4, 1.1 * kneed(4));
  EXPECT_NEAR(costs.row_cost(4, 1), 1.3 * kneed(4), 1e-9);
}

TEST(CostModel, AWidthNoLongerMeasuredFollowsTheMachinesSpeed) {
  // An engine that starts while other load holds the cores: its first windows of two and four
  // tokens ran at 2.2 times their cost, then the load went away and only plain steps were run
  // (the policy, pricing the windows as measured, drafted no more). The stale widths must come
  // down with the plain step, or drafting would never be tried again.
  CostModel costs;
  for (int i = 0; i < 30; ++i) {
    const int tokens = std::array{1, 2, 4}[static_cast<size_t>(i % 3)];
    costs.observe_forward(tokens, 2.2 * kneed(tokens));
  }
  for (int i = 0; i < 300; ++i) costs.observe_forward(1, kneed(1));
  EXPECT_NEAR(costs.row_cost(1, 1), kneed(1), 0.02 * kneed(1));
  EXPECT_LT(costs.row_cost(2, 1), 1.25 * kneed(2));
  EXPECT_LT(costs.row_cost(4, 1), 1.25 * kneed(4));
  // Widths measured again are priced as measured.
  for (int i = 0; i < 200; ++i) costs.observe_forward(i % 2 == 0 ? 1 : 4, kneed(i % 2 == 0 ? 1 : 4));
  EXPECT_NEAR(costs.row_cost(4, 1), kneed(4), 0.05 * kneed(4));
  EXPECT_NEAR(costs.row_cost(1, 1), kneed(1), 0.05 * kneed(1));
}

TEST(CostModel, FixedPricesAreWhatTheyWereGiven) {
  const CostModel costs = CostModel::fixed(0.1);
  EXPECT_TRUE(costs.calibrated());
  EXPECT_TRUE(costs.slope_known());
  EXPECT_DOUBLE_EQ(costs.speed(), 1.0);
  for (const int w : {1, 2, 5, 9, 64}) EXPECT_NEAR(costs.row_cost(w, 1), 1.0 + 0.1 * (w - 1), 1e-9) << w;
  const DraftCost chained = DraftCost::fixed(DraftCost::Shape::per_draft, 0.1, 0.1);
  const DraftCost block = DraftCost::fixed(DraftCost::Shape::per_block, 0.3, 0.0);
  for (const int k : {1, 3, 7}) {
    EXPECT_NEAR(chained.cost(k), 0.1 + 0.1 * k, 1e-9) << k;
    EXPECT_NEAR(block.cost(k), 0.3, 1e-9) << k;
  }
}

TEST(DepthPolicy, OnFixedPricesTheDepthFollowsTheRowsOwnOutcomes) {
  // The prices a rejection-mode row decides by: the same outcomes give the same depths, deep
  // where every draft is accepted, paused where none is.
  const CostModel costs = CostModel::fixed(0.1);
  const DraftCost draft = DraftCost::fixed(DraftCost::Shape::per_draft, 0.1, 0.1);
  const auto depths = [&](bool accepted) {
    DepthPolicy policy(6, true);
    std::vector<int> out;
    for (int round = 0; round < 40; ++round) {
      const int k = policy.next_depth(costs, draft, 1);
      out.push_back(k);
      policy.observe(k, accepted ? k : 0);
    }
    return out;
  };
  const std::vector<int> accepted = depths(true), rejected = depths(false);
  EXPECT_EQ(depths(true), accepted);
  EXPECT_EQ(depths(false), rejected);
  EXPECT_EQ(accepted.back(), 6);
  // Paused for most of the rounds: only probes draft once the estimates have fallen.
  EXPECT_LE(std::count_if(rejected.begin() + 10, rejected.end(), [](int k) { return k > 0; }), 4);
}

TEST(DepthPolicy, DraftsOneTokenWhereAWindowOfTwoCostsAsMuchAsOne) {
  // Drafts accepted a quarter of the time: one more token in a window that costs nothing extra
  // pays; five do not (a straight line through these costs charges the second token 0.1 ms and
  // the policy then drafts nothing).
  CostModel costs = kneed_model();
  DraftCost draft;
  draft.observe(10, 10 * 1e-6);
  DepthPolicy policy(10, true);
  for (int i = 0; i < 40; ++i) policy.observe(5, i % 4 == 0 ? 1 : 0);
  const int depth = policy.next_depth(costs, draft, 1);
  EXPECT_GE(depth, 1);
  EXPECT_LE(depth, 2);
}

TEST(DepthPolicy, InABatchEveryRowsWindowIsCharged) {
  // Eight rows: a plain iteration is a forward of 8 tokens; forwards of 9 and 10 tokens were
  // measured at its cost (a quiet moment, or the knee), while 16 and 24 tokens, what eight rows
  // drafting one or two tokens each make, cost 1.8 and 2.7 times as much. At an acceptance of
  // about 0.6 no depth pays; priced as if only this row drafted, one or two drafts looked free.
  CostModel costs;
  for (int i = 0; i < 20; ++i) {
    for (int tokens : {8, 9, 10}) costs.observe_forward(tokens, kneed(8));
    for (int tokens : {16, 24}) costs.observe_forward(tokens, kneed(tokens));
  }
  DraftCost draft;
  draft.observe(10, 10 * 1e-6);
  DepthPolicy policy(10, true);
  for (int i = 0; i < 40; ++i) policy.observe(2, i % 5 < 3 ? 2 : 0);
  EXPECT_EQ(policy.next_depth(costs, draft, 8), 0);
}

TEST(DepthPolicy, APositionRejectedWithinTheDraftedDepthStaysLow) {
  // Two drafts a round: the first is rejected three rounds in four, the second always. The
  // second position is tried only in the rounds the first is accepted; the others must not
  // lift its estimate back toward the prior (they asked for it and never reached it).
  DepthPolicy policy(10, true);
  for (int i = 0; i < 80; ++i) policy.observe(2, i % 4 == 0 ? 1 : 0);
  EXPECT_LT(policy.expected_emitted(2) - policy.expected_emitted(1), 0.05);
}

// Costs under which no depth pays even at full acceptance (dear: every token of a forward costs
// a whole step, a draft a tenth of one) and under which drafting is nearly free (cheap).
struct DearAndCheapCosts {
  CostModel dear, cheap;
  DraftCost dear_draft, cheap_draft;
  DearAndCheapCosts() {
    for (int i = 0; i < 40; ++i) {
      const int tokens = 1 + i % 4;
      dear.observe_forward(tokens, 1e-3 * tokens);
      cheap.observe_forward(tokens, 1e-3);
    }
    dear_draft.observe(10, 10 * 0.1e-3);
    cheap_draft.observe(10, 10 * 1e-6);
  }
};

TEST(DepthPolicy, DoesNotProbeWhereNoDepthCouldPay) {
  // Every token of a forward costs a whole step and a draft a tenth of one: no depth pays even
  // at full acceptance, so a paused row probes only once its back-off has reached the cap (64
  // rounds), against 4, 8, 16, 32, 64, 64 rounds apart where drafts are free.
  const DearAndCheapCosts c;
  const CostModel &dear = c.dear, &cheap = c.cheap;
  const DraftCost &dear_draft = c.dear_draft, &cheap_draft = c.cheap_draft;
  for (bool is_dear : {true, false}) {
    DepthPolicy policy(10, true);
    for (int i = 0; i < 30; ++i) policy.observe(10, 0);
    int probes = 0;
    for (int round = 0; round < 200; ++round)
      probes += is_dear ? policy.next_depth(dear, dear_draft, 1) > 0 : policy.next_depth(cheap, cheap_draft, 1) > 0;
    if (is_dear) {
      EXPECT_LE(probes, 3);
    } else {
      EXPECT_GE(probes, 6);
    }
  }
}

TEST(DepthPolicy, SaysHowFarAheadTheNextRoundThatMayDraftIs) {
  // After each round's choice, rounds_to_draft() counts down a pause to the probe that ends it
  // (1: the next round may draft), so that the engine taps a paused row only in the rounds just
  // before it; cannot_pay() tells a pause whose costs leave no depth paying at any acceptance
  // (same costs as DoesNotProbeWhereNoDepthCouldPay) from one that waits for acceptance; and
  // plain_rounds() counts the rounds that certainly draft nothing.
  const DearAndCheapCosts c;
  const CostModel &dear = c.dear, &cheap = c.cheap;
  const DraftCost &dear_draft = c.dear_draft, &cheap_draft = c.cheap_draft;
  for (bool is_dear : {true, false}) {
    const CostModel& costs = is_dear ? dear : cheap;
    const DraftCost& draft = is_dear ? dear_draft : cheap_draft;
    DepthPolicy policy(10, true);
    EXPECT_EQ(policy.rounds_to_draft(), 1);  // a new row may draft at once
    for (int i = 0; i < 30; ++i) policy.observe(10, 0);
    ASSERT_EQ(policy.next_depth(costs, draft, 1), 0);  // the pause starts: 4 rounds
    EXPECT_EQ(policy.cannot_pay(), is_dear);
    for (int left = 4; left >= 1; --left) {
      EXPECT_EQ(policy.rounds_to_draft(), left) << (is_dear ? "dear" : "cheap");
      // The rounds before the last draft nothing whatever the costs: a step for them may be
      // launched before the round before them is known.
      EXPECT_EQ(policy.plain_rounds(), left - 1) << (is_dear ? "dear" : "cheap");
      const int depth = policy.next_depth(costs, draft, 1);
      // The pause's last round: a probe where drafts could pay, a renewed pause where not.
      EXPECT_EQ(depth, left == 1 && !is_dear ? 1 : 0) << left;
    }
    EXPECT_EQ(policy.rounds_to_draft(), is_dear ? 8 : 1);
    EXPECT_EQ(policy.cannot_pay(), is_dear);
  }
  DepthPolicy fixed(10, false);
  fixed.next_depth(dear, dear_draft, 1);
  EXPECT_EQ(fixed.rounds_to_draft(), 1);
  EXPECT_EQ(fixed.plain_rounds(), 0);
  EXPECT_FALSE(fixed.cannot_pay());
  DepthPolicy never(0, true);
  EXPECT_GT(never.rounds_to_draft(), 1000);
  EXPECT_GT(never.plain_rounds(), 1000);
}

TEST(DepthPolicy, RationsProbesThatTheCostsSayCannotPay) {
  // Eight rows paused together reach the back-off cap in the same iteration. Where the costs
  // say no depth could pay, only as many of them probe as the iteration allows (the engine
  // allows one per method group); the others renew their pause. Probes that could pay are
  // not rationed.
  CostModel dear;
  for (int i = 0; i < 40; ++i) {
    const int tokens = 8 * (1 + i % 4);
    dear.observe_forward(tokens, 1e-3 * tokens);
  }
  DraftCost draft;
  draft.observe(10, 10 * 0.1e-3);
  std::vector<DepthPolicy> rows(8, DepthPolicy(10, true));
  for (DepthPolicy& row : rows)
    for (int i = 0; i < 30; ++i) row.observe(10, 0);
  int probes = 0, iterations_with_probes = 0;
  for (int iteration = 0; iteration < 400; ++iteration) {
    int allowed = 1, here = 0;
    for (DepthPolicy& row : rows) here += row.next_depth(dear, draft, 8, &allowed) > 0;
    EXPECT_LE(here, 1);
    probes += here;
    iterations_with_probes += here > 0;
  }
  EXPECT_GE(probes, 3);  // the cap's probes still go out, one row at a time
  EXPECT_EQ(probes, iterations_with_probes);

  CostModel cheap;
  for (int i = 0; i < 40; ++i) cheap.observe_forward(8 * (1 + i % 4), 8e-3);
  DraftCost free_draft;
  free_draft.observe(10, 10 * 1e-6);
  std::vector<DepthPolicy> hopeful(8, DepthPolicy(10, true));
  for (DepthPolicy& row : hopeful)
    for (int i = 0; i < 30; ++i) row.observe(10, 0);
  int most = 0;
  for (int iteration = 0; iteration < 20; ++iteration) {
    int allowed = 1, here = 0;
    for (DepthPolicy& row : hopeful) here += row.next_depth(cheap, free_draft, 8, &allowed) > 0;
    most = std::max(most, here);
  }
  EXPECT_EQ(most, 8);
}

TEST(DraftCost, AColdFirstDraftFigureFallsWithinAFewRounds) {
  // A request's first draft runs on cold caches; its figure must not price the next rounds.
  DraftCost draft;
  draft.observe(1, 0.4e-3);
  for (int i = 0; i < 3; ++i) draft.observe(2, 2 * 0.1e-3);
  EXPECT_LT(draft.cost(1), 0.15e-3);
  // A slow round raises the estimate by at most half of itself... and slowly.
  const double before = draft.cost(1);
  draft.observe(1, 10e-3);
  EXPECT_LT(draft.cost(1), 1.3 * before);
}

TEST(DraftCost, ACallThatPaidMoreBoundsThePriceFromAbove) {
  // Calls measured while other load held the cores: 1 ms at depth 1. The row then pauses and
  // probes only with calls that also catch it up on its pause; they take 0.3 ms now.
  DraftCost draft;
  for (int i = 0; i < 6; ++i) draft.observe(1, 1.0e-3);
  const double sealed = draft.cost(1);
  // Dearer than the price: they say nothing about a usual call.
  for (int i = 0; i < 10; ++i) draft.observe_bound(1, 3.0e-3);
  EXPECT_DOUBLE_EQ(draft.cost(1), sealed);
  // Cheaper: a usual call costs at most that, and the price comes down.
  for (int i = 0; i < 40; ++i) draft.observe_bound(1, 0.3e-3);
  EXPECT_LT(draft.cost(1), 0.4e-3);
  EXPECT_GT(draft.cost(1), 0.25e-3);
}

TEST(DraftCost, AveragesCallsOfDifferentCostsPerToken) {
  // Calls alternate between 0.06 and 0.10 ms a drafted token (a first step after a target
  // forward costs more than the next ones). The estimate is their mean, not the cheap figure:
  // an estimate 12 % low drafted where drafting did not pay.
  DraftCost draft;
  for (int i = 0; i < 60; ++i) draft.observe(1, i % 2 == 0 ? 0.06e-3 : 0.10e-3);
  EXPECT_NEAR(draft.cost(1), 0.08e-3, 0.004e-3);
}

TEST(DraftCost, PricesADeepCallByItsStepsNotByAShallowCallsFigurePerToken) {
  // A draft model's call: 0.06 ms whatever its depth (feeding the last round's tokens) and
  // 0.115 ms a step. Calls of one and three drafts cost 0.175 and 0.405 ms, 0.175 and 0.135 ms a
  // drafted token; priced per token, a call of eight looked like 1.2 ms against its 0.98.
  const DraftCost draft = draft_model_calls();
  EXPECT_NEAR(draft.cost(8), 0.98e-3, 0.02e-3);
  EXPECT_NEAR(draft.cost(1), 0.175e-3, 0.01e-3);
  EXPECT_EQ(draft.cost(0), 0.0);
}

TEST(DraftCost, ACallPastTheDraftersOwnDepthCostsAsOneOfThatDepth) {
  // A chain of at most 8 steps (0.06 ms fixed, 0.115 ms a step) whose rounds the request's text
  // carries on to 15 drafts: the calls that return 15 drafts ran 8 steps, and are priced so.
  DraftCost draft(DraftCost::Shape::per_draft, 8);
  for (int round = 0; round < 6; ++round)
    for (const int k : {1, 3, 8, 15}) draft.observe(k, 0.06e-3 + 0.115e-3 * std::min(k, 8));
  EXPECT_NEAR(draft.cost(8), 0.98e-3, 0.02e-3);
  EXPECT_EQ(draft.cost(15), draft.cost(8));
  EXPECT_NEAR(draft.cost(3), 0.405e-3, 0.02e-3);
  const DraftCost fixed = DraftCost::fixed(DraftCost::Shape::per_draft, 0.1e-3, 0.1e-3, 4);
  EXPECT_NEAR(fixed.cost(4), 0.5e-3, 0.01e-3);
  EXPECT_EQ(fixed.cost(12), fixed.cost(4));
}

TEST(DraftCost, KeepsTheStepsCostWhileARowSettlesAtOneDepth) {
  // A chained head's calls: 0.2 ms to feed the last round's positions plus 0.07 ms a step, seen
  // at depths 1 to 8, then for a long while at depth 2 only (a row that settled there). The
  // per-step part measured stands and a call of eight is still priced at 0.76 ms, where splitting
  // the depth-2 calls by the shape (a step for the fixed part) would price it at 1.02 ms and the
  // deep rounds, dearer than they are, would not be drafted again. The fixed part still follows
  // the timings: calls that got 0.05 ms slower move every depth's price by that.
  DraftCost draft;
  auto call = [](int depth, double extra = 0) { return (0.2 + 0.07 * depth + extra) * 1e-3; };
  for (int i = 0; i < 40; ++i) draft.observe(1 + i % 8, call(1 + i % 8));
  EXPECT_NEAR(draft.cost(8), call(8), 0.005e-3);
  for (int i = 0; i < 300; ++i) draft.observe(2, call(2));
  EXPECT_NEAR(draft.cost(8), call(8), 0.005e-3);
  for (int i = 0; i < 300; ++i) draft.observe(2, call(2, 0.05));
  EXPECT_NEAR(draft.cost(8), call(8, 0.05), 0.005e-3);
  EXPECT_NEAR(draft.cost(2), call(2, 0.05), 0.005e-3);
}

TEST(DepthPolicy, ARowPausedInASlowMinuteDraftsAgainWhenTheMachineRecovers) {
  // Other load holds the cores for the engine's first minute: every forward and every draft call
  // of a draft model (0.06 ms plus 0.3 ms a step) takes twice its time, and the forwards' first
  // figures are set then. Then the load goes while the row is paused (its text turned to
  // something its drafts miss): only plain steps are measured, and the machine's speed with
  // them. A round of its drafts, all accepted, pays again on the calls' price at the machine's
  // present speed; priced as measured in the slow minute, next to the re-measured forwards, a
  // call looked twice as dear as it is and the row stayed paused.
  CostModel costs = cpu_window_model(2.0);
  DraftCost draft;
  for (int i = 0; i < 90; ++i) {
    const int depth = i % 2 == 0 ? 2 : 6;
    draft.observe(depth, 2 * (0.06 + 0.3 * depth) * 1e-3, costs.speed());
  }
  for (int i = 0; i < 300; ++i) costs.observe_forward(1, kCpuWindowMs[1] * 1e-3);
  EXPECT_LT(costs.speed(), 0.6);
  EXPECT_NEAR(costs.forward_cost(1), kCpuWindowMs[1] * 1e-3, 0.05e-3);
  EXPECT_NEAR(draft.cost(2, costs.speed()), (0.06 + 0.3 * 2) * 1e-3, 0.1e-3);
  DepthPolicy policy(8, true);
  for (int i = 0; i < 30; ++i) policy.observe(8, 8);
  EXPECT_GT(policy.next_depth(costs, draft, 1), 0);
}

TEST(DraftCost, OneDepthSeenCountsOneStepForTheCallsFixedPart) {
  // Only calls of one draft seen (0.2 ms each): the call is split as a step for feeding the last
  // round's tokens and one for the draft, so a call of five is priced at six steps, 0.6 ms, not
  // five whole calls (1.0 ms): the row must be able to try a depth it has not measured.
  DraftCost draft;
  for (int i = 0; i < 10; ++i) draft.observe(1, 0.2e-3);
  EXPECT_NEAR(draft.cost(1), 0.2e-3, 1e-9);
  EXPECT_NEAR(draft.cost(5), 0.6e-3, 1e-9);
}

TEST(DraftCost, OneDepthSeenOfABlockDrafterPricesEveryDepthAsThatCall) {
  // A block drafter's call is one forward whatever its depth: calls of three drafts at 0.65 ms
  // price a call of one or of seven at 0.65 ms too, where the per-draft split would say 0.33 and
  // 1.3 ms.
  DraftCost block(DraftCost::Shape::per_block), per_draft;
  for (int i = 0; i < 10; ++i) {
    block.observe(3, 0.65e-3);
    per_draft.observe(3, 0.65e-3);
  }
  EXPECT_NEAR(block.cost(1), 0.65e-3, 1e-9);
  EXPECT_NEAR(block.cost(7), 0.65e-3, 1e-9);
  EXPECT_NEAR(per_draft.cost(7), 1.3e-3, 1e-9);
  EXPECT_EQ(block.cost(0), 0.0);
  // Depths that spread still fit a slope (a block drafter whose LM head runs per draft).
  DraftCost spread(DraftCost::Shape::per_block);
  for (int i = 0; i < 40; ++i) spread.observe(i % 2 == 0 ? 1 : 5, (0.6 + 0.02 * (i % 2 == 0 ? 1 : 5)) * 1e-3);
  EXPECT_NEAR(spread.cost(7), 0.74e-3, 0.01e-3);
}

TEST(DepthPolicy, DraftsABlockDrafterDeepFromOneMeasuredDepth) {
  // A block drafter's calls, 0.65 ms whatever the depth, measured at depth 3 only; a plain step
  // costs 0.65 ms and a window the measured CPU line. The row's rounds of seven drafts accept
  // 0, 1, 7 and 7 in turn (code: a line is either known or not): seven drafts a round emit 4.75
  // tokens for 1.56 + 0.65 ms, 1.3x a plain step's rate, the best of any depth when the call
  // costs the same at each. Priced per draft (a call of seven at 1.3 ms, of one at 0.33 ms) the
  // policy drafted two.
  const CostModel costs = cpu_window_model();
  DraftCost block(DraftCost::Shape::per_block), per_draft;
  for (int i = 0; i < 10; ++i) {
    block.observe(3, 0.65e-3);
    per_draft.observe(3, 0.65e-3);
  }
  DepthPolicy a(7, true), b(7, true);
  const int accepted[] = {0, 1, 7, 7};
  for (int i = 0; i < 30; ++i) {
    a.observe(7, accepted[i % 4]);
    b.observe(7, accepted[i % 4]);
  }
  EXPECT_EQ(a.next_depth(costs, block, 1), 7);
  EXPECT_LE(b.next_depth(costs, per_draft, 1), 2);
}

TEST(DepthPolicy, AProbeDraftsAtTheDepthWithTheBestRate) {
  // A block drafter whose first rounds on a reply were rejected (text it had not seen) is paused.
  // Priced as on a GPU (a target step 0.26 ms, windows 3 us a token more; the block drafter's
  // call 0.27 ms whatever its depth), its probe drafts the whole block: the extra drafts cost
  // next to nothing, and where the reply has turned to a loop that the drafter gets right, the
  // probe's round emits the block and shows every position's acceptance, where one draft would
  // show one. Priced as on a CPU, where each token past the third costs a sixth of a step, it
  // drafts two.
  const CostModel gpu = gpu_step_model();
  const CostModel cpu = cpu_window_model();
  DraftCost block(DraftCost::Shape::per_block);
  for (int i = 0; i < 10; ++i) block.observe(3, 0.27e-3);
  auto paused_row = [&](const CostModel& costs) {
    auto policy = std::make_unique<DepthPolicy>(7, true);
    int depth = 1;
    for (int round = 0; round < 6 && depth > 0; ++round) {
      depth = policy->next_depth(costs, block, 1);
      if (depth > 0) policy->observe(depth, round % 3 == 2 ? 1 : 0);
    }
    EXPECT_EQ(depth, 0) << "the row drafts on";
    return policy;
  };
  auto probe_depth = [&](const CostModel& costs) {
    std::unique_ptr<DepthPolicy> policy = paused_row(costs);
    for (int round = 0; round < 200; ++round) {
      const int depth = policy->next_depth(costs, block, 1);
      if (depth > 0) {
        EXPECT_TRUE(policy->probing());
        return depth;
      }
    }
    return 0;
  };
  EXPECT_EQ(probe_depth(gpu), 7);
  EXPECT_EQ(probe_depth(cpu), 2);
}

TEST(DepthPolicy, DraftsDeepWhenADraftModelsCallsHaveAFixedPart) {
  // A draft model's calls cost 0.06 ms plus 0.115 ms a step, measured at depths 1 and 3 only; a
  // plain step costs 0.65 ms and a window the measured CPU line. Four rounds in five accept all
  // eight drafts, the fifth two. Each further draft adds ~0.25 ms for nearly a token, so deep
  // rounds pay; priced at the shallow calls' 0.155 ms a drafted token the policy drafted two.
  const CostModel costs = cpu_window_model();
  const DraftCost draft = draft_model_calls();
  DepthPolicy policy(8, true);
  for (int i = 0; i < 30; ++i) policy.observe(8, i % 5 == 0 ? 2 : 8);
  EXPECT_GE(policy.next_depth(costs, draft, 1), 6);
}

TEST(DepthPolicy, LearnsARowsAcceptanceWithinAFewRounds) {
  // A request lasts some 30 rounds: three rejected first drafts must already tell.
  DepthPolicy policy(10, true);
  for (int i = 0; i < 3; ++i) policy.observe(2, 0);
  EXPECT_LT(policy.acceptance(), 0.2);
  DepthPolicy good(10, true);
  for (int i = 0; i < 3; ++i) good.observe(2, 2);
  EXPECT_GT(good.acceptance(), 0.85);
}

TEST(DepthPolicy, AnEarlyRejectionDoesNotCapTheDepthForGood) {
  // One round rejects its second draft; every later round drafts one token and has it accepted.
  // The second position must be tried again, not held below its break-even for good.
  // Drafts cost a third of a plain step here, so a second draft pays only at an acceptance
  // above ~0.75 (the prior, 0.85, is above; one rejection takes the estimate below).
  CostModel costs = calibrated_model();
  DraftCost draft;
  draft.observe(10, 10 * 0.3e-3);
  DepthPolicy policy(10, true);
  policy.observe(1, 1);  // so that the rejection lands in the after-a-full-accept regime
  policy.observe(3, 1);
  for (int i = 0; i < 30; ++i) policy.observe(1, 1);
  EXPECT_GE(policy.next_depth(costs, draft, 1), 2);
}

TEST(DepthPolicy, SpeculatesDeepWhenDraftsAreAcceptedEvenAfterASpike) {
  CostModel costs = calibrated_model();
  DraftCost draft;
  draft.observe(10, 10 * 1e-6);
  DepthPolicy policy(10, true);
  for (int i = 0; i < 30; ++i) policy.observe(10, 10);
  EXPECT_EQ(policy.next_depth(costs, draft, 1), 10);
  costs.observe_forward(11, 0.050);
  EXPECT_EQ(policy.next_depth(costs, draft, 1), 10);
}

TEST(DepthPolicy, PredictsARoundFromWhatTheLastOneDid) {
  // Copy spans: 4 rounds whose 10 drafts are all accepted, then 4 rounds that accept only the
  // first draft. After a full accept the next round is likely long, after a break short.
  const CostModel costs = calibrated_model();
  const DraftCost draft;
  DepthPolicy after_full(10, true), after_break(10, true);
  for (int span = 0; span < 20; ++span) {
    for (DepthPolicy* policy : {&after_full, &after_break}) {
      for (int i = 0; i < 4; ++i) policy->observe(10, 10);
      for (int i = 0; i < 4; ++i) policy->observe(10, 1);
    }
  }
  for (int i = 0; i < 4; ++i) after_full.observe(10, 10);
  after_break.observe(10, 10);
  after_break.observe(10, 1);
  EXPECT_GT(after_full.expected_emitted(10), 7.0);
  EXPECT_GT(after_full.expected_emitted(10), after_break.expected_emitted(10) + 2.0);
  EXPECT_EQ(after_full.next_depth(costs, draft, 1), 10);
  EXPECT_LE(after_break.next_depth(costs, draft, 1), 2);
  // A plain step (nothing drafted) leaves the regime as it was.
  after_full.observe(0, 0);
  EXPECT_GT(after_full.expected_emitted(10), 7.0);
}

TEST(DepthPolicy, ARegimeNotYetSeenBorrowsTheOthersEstimates) {
  // GPU-like costs: a replayed plain step 0.15 ms, any window 0.25 ms and up, n-gram drafts
  // free. The row's first drafts are accepted one time in five and its second never; then one
  // probe is accepted whole, so the next round is the first after a full accept. With that
  // regime's priors (0.6, 0.85, ...) it asked for seven drafts; with the row's own figures it
  // does not draft.
  CostModel costs;
  for (int i = 0; i < 64; ++i) {
    const int tokens = 1 + i % 8;
    costs.observe_forward(tokens, tokens == 1 ? 0.15e-3 : 0.25e-3 + 0.015e-3 * (tokens - 2));
  }
  DraftCost draft;
  draft.observe(10, 10 * 1e-6);
  DepthPolicy policy(10, true);
  for (int i = 0; i < 20; ++i) policy.observe(2, i % 5 == 0 ? 1 : 0);
  policy.observe(1, 1);
  EXPECT_EQ(policy.next_depth(costs, draft, 1), 0);
}

TEST(DepthPolicy, TwoRejectionsInOneRegimeDoNotPauseARowThatPays) {
  // A draft-model row (calls of 0.06 ms plus 0.115 ms a step, CPU window costs): its rounds
  // after a rejection accept three drafts in four; twice, the round after a full accept has
  // its first draft rejected. Estimated from those two rounds alone, the after-a-full-accept
  // regime's first position stood at 0.2 and the row paused for four plain rounds although its
  // drafts pay overall.
  const CostModel costs = cpu_window_model();
  const DraftCost draft = draft_model_calls();
  DepthPolicy policy(8, true);
  for (int i = 0; i < 12; ++i) policy.observe(3, i % 4 == 0 ? 0 : 2);
  policy.observe(3, 3);
  policy.observe(3, 0);  // the first draft after a full accept: rejected
  policy.observe(3, 3);
  policy.observe(3, 0);  // again
  policy.observe(3, 3);
  EXPECT_GT(policy.next_depth(costs, draft, 1), 0);
}

TEST(DepthPolicy, DraftsShallowUntilTheSlopeIsMeasured) {
  // Only one-token steps seen: the cost of a drafted token is unknown, and the policy must not
  // take it for free, however good the acceptance looks.
  CostModel costs;
  for (int i = 0; i < 20; ++i) costs.observe_forward(1, truth(1));
  ASSERT_TRUE(costs.calibrated());
  ASSERT_FALSE(costs.slope_known());
  const DraftCost draft;
  DepthPolicy policy(10, true);
  for (int i = 0; i < 30; ++i) policy.observe(10, 10);
  const int first = policy.next_depth(costs, draft, 1), second = policy.next_depth(costs, draft, 1);
  EXPECT_LE(std::max(first, second), 3);
  EXPECT_NE(first, second);  // widths that differ, so that the fit learns the slope
  // Windows of those widths give the fit its slope; then the depth follows the acceptance.
  for (int i = 0; i < 10; ++i) {
    costs.observe_forward(2, truth(2));
    costs.observe_forward(4, truth(4));
  }
  ASSERT_TRUE(costs.slope_known());
  EXPECT_EQ(policy.next_depth(costs, draft, 1), 10);
}

TEST(DepthPolicy, PausesWhenDraftsAreRejected) {
  CostModel costs = calibrated_model();
  DraftCost draft;
  draft.observe(10, 10 * 1e-6);
  DepthPolicy policy(10, true);
  for (int i = 0; i < 30; ++i) policy.observe(10, 0);
  EXPECT_EQ(policy.next_depth(costs, draft, 1), 0);
  // Not adaptive: always the maximum depth.
  DepthPolicy fixed(10, false);
  EXPECT_EQ(fixed.next_depth(costs, draft, 1), 10);
}

TEST(DepthPolicy, DraftsPastTheDepthWhoseFullAcceptsLandOnABreak) {
  // A reply that repeats a cycle whose proposals hold for five tokens and then break: each round
  // of five drafts is accepted whole and lands the next round on the broken token, whose first
  // draft is rejected. Round by round, five drafts price best (the positions past five are
  // untried); over both regimes, drafting deeper avoids the wasted round that a full accept
  // buys. A control row whose full accepts are followed by more of them stays at five.
  // Windows past six tokens take a second pass over the weights: seven tokens cost 5.9 ms
  // against 4.7 for six (the shape measured on a CPU, rounded).
  CostModel costs;
  const double window[] = {0, 2.4, 3.0, 3.4, 3.9, 4.3, 4.7, 5.9, 6.4, 6.9};
  for (int i = 0; i < 90; ++i) costs.observe_forward(1 + i % 9, window[1 + i % 9] * 1e-3);
  const DraftCost draft;
  DepthPolicy cycle(8, true), control(8, true);
  for (int i = 0; i < 30; ++i) {
    cycle.observe(5, 5);
    cycle.observe(3, 0);
    control.observe(5, 5);
  }
  EXPECT_EQ(control.next_depth(costs, draft, 1), 5);
  EXPECT_GT(cycle.next_depth(costs, draft, 1), 5);
}

TEST(DepthPolicy, ARareAcceptDoesNotRestartTheShortestPauses) {
  // A hidden-state head on a text it rarely gets right, priced as on a GPU: a target step 0.26
  // ms (3 us a token more), a draft call 0.1 ms plus 0.03 a draft. One drafting round in five
  // has its first draft accepted, none further. Every drafting round costs more than it emits,
  // so over a request of 128 rounds the row must spend few of them drafting: a probe that lands
  // on a lucky round must not send the back-off back to four rounds.
  const CostModel costs = gpu_step_model();
  DraftCost draft;
  for (int k : {1, 3, 6}) draft.observe(k, 0.1e-3 + 0.03e-3 * k);
  DepthPolicy policy(6, true);
  int drafting = 0;
  for (int round = 0; round < 128; ++round) {
    const int depth = policy.next_depth(costs, draft, 1);
    if (depth == 0) continue;
    ++drafting;
    policy.observe(depth, drafting % 5 == 0 ? 1 : 0);
  }
  EXPECT_LE(drafting, 10);
}

}  // namespace
}  // namespace specdec
