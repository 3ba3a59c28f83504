// The depth policy's cost fit and choices: it recovers a linear forward cost, a lone timing
// spike does not derail it (nor pause speculation), a lasting change of cost is still learned,
// and the depth follows acceptance (deep when drafts are accepted, paused when they are not).
#include <gtest/gtest.h>

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

TEST(DepthPolicy, SpeculatesDeepWhenDraftsAreAcceptedEvenAfterASpike) {
  CostModel costs = calibrated_model();
  costs.observe_draft(10, 10 * 1e-6);
  DepthPolicy policy(10, true);
  for (int i = 0; i < 30; ++i) policy.observe(10, 10);
  EXPECT_EQ(policy.next_depth(costs, 1), 10);
  costs.observe_forward(11, 0.050);
  EXPECT_EQ(policy.next_depth(costs, 1), 10);
}

TEST(DepthPolicy, PausesWhenDraftsAreRejected) {
  CostModel costs = calibrated_model();
  costs.observe_draft(10, 10 * 1e-6);
  DepthPolicy policy(10, true);
  for (int i = 0; i < 30; ++i) policy.observe(10, 0);
  EXPECT_EQ(policy.next_depth(costs, 1), 0);
  // Not adaptive: always the maximum depth.
  DepthPolicy fixed(10, false);
  EXPECT_EQ(fixed.next_depth(costs, 1), 10);
}

}  // namespace
}  // namespace specdec
