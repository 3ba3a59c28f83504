// Paused rows' probes in a batch: a group's rows probe one at a time, spaced so that the probes
// take a small share of the batch's time, where each row alone would probe on its own back-off.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "sampling/sampling.h"
#include "speculative/coordinator.h"
#include "speculative/methods/ngram_method.h"

namespace specdec {
namespace {

// A batch of `rows` whose plain step costs 0.3 ms and whose windows cost 0.2 ms more per extra
// token a row (the n-gram group's own draft calls cost next to nothing).
CostModel batch_costs(int rows) {
  CostModel costs;
  for (int i = 0; i < 80; ++i) {
    const int width = 1 + i % 4;
    costs.observe_forward(rows * width, (0.3 + 0.2 * (width - 1)) * 1e-3);
  }
  return costs;
}

// An n-gram method that also declares a hidden-state tap, wanted in the four rounds before a
// probe (as a block drafter asks): which rows the target would tap is then the coordinator's call.
class TappingMethod : public NgramMethod {
 public:
  TargetNeeds needs() const override {
    TargetNeeds n;
    n.tap_layers = {0};
    n.resume_taps = 4;
    return n;
  }
};

struct ProbeCounts {
  int iterations_with_probes = 0;
  int probes = 0;
  int tapped = 0;  // row-iterations in which the target would tap the row
};

// Runs `iterations` rounds of `rows` rows that never accept a draft, counting the iterations in
// which some row probed. With `probe_steps` > 0 the coordinator is told each iteration's time:
// 0.3 ms plain, `probe_steps` times that with a probe.
ProbeCounts count_probes(int rows, int iterations, double probe_steps = 0) {
  TargetView target;
  target.taps = true;
  Coordinator coordinator(target);
  coordinator.add_method("ngram", std::make_shared<TappingMethod>());
  std::vector<SpecRow> spec(static_cast<size_t>(rows));
  for (int i = 0; i < rows; ++i) {
    SpecRow& r = spec[static_cast<size_t>(i)];
    r.id = i;
    r.method = "ngram";
    r.policy.emplace(3, true, 0.01);  // a row whose drafts are never accepted: it pauses
    coordinator.join(r);
  }
  const CostModel costs = batch_costs(rows);
  // Rows reach their requests' rounds at different times: row i is 3 i rounds further on its
  // own back-off schedule.
  const DraftCost no_calls;
  for (int i = 0; i < rows; ++i)
    for (int k = 0; k < 3 * i; ++k) {
      DepthPolicy& p = *spec[static_cast<size_t>(i)].policy;
      p.observe(p.next_depth(costs, no_calls, rows) > 0 ? 1 : 0, 0);
    }
  const SamplingParams greedy;
  ProbeCounts counts;
  for (int it = 0; it < iterations; ++it) {
    std::vector<DraftAsk> asks;
    for (SpecRow& r : spec) asks.push_back(DraftAsk{&r, 5, 100 + it, 8, &greedy});
    coordinator.propose(asks, costs, rows);
    bool any = false;
    for (SpecRow& r : spec) {
      counts.tapped += coordinator.forward_taps(r).empty() ? 0 : 1;
      if (!r.policy->probing()) {
        r.policy->observe(0, 0);
        continue;
      }
      any = true;
      counts.probes += 1;
      r.policy->observe(1, 0);  // the probe's draft is rejected
    }
    counts.iterations_with_probes += any ? 1 : 0;
    if (probe_steps > 0) coordinator.observe_iteration((any ? probe_steps : 1.0) * 0.3e-3);
  }
  return counts;
}

int iterations_with_probes(int rows, int iterations, double probe_steps = 0) {
  return count_probes(rows, iterations, probe_steps).iterations_with_probes;
}

TEST(BatchProbes, AGroupsPausedRowsProbeOneAtATimeWithinABudget) {
  // Alone, a row probes after pauses of 4, 8, 16, 32 and 64 rounds: five of its first 130.
  const int alone = iterations_with_probes(1, 130);
  EXPECT_GE(alone, 4);
  EXPECT_LE(alone, 6);
  // Eight such rows, each on its own back-off, would probe in some 40 of 130 iterations. Spaced
  // so that a probe's extra cost (two-token windows, 0.2 ms on a 0.3 ms step) takes at most 2 %
  // of the batch's time, probes come at most once in ~34 iterations.
  const int batch = iterations_with_probes(8, 130);
  EXPECT_GE(batch, 1);
  EXPECT_LE(batch, 5) << batch << " of 130 iterations carried a probe";
}

TEST(BatchProbes, AProbeMeasuredDearSpacesTheNextOnesFurther) {
  // A batch's probe iteration measured at 15 plain steps (its shapes not recorded yet, which the
  // cost fits leave out): the next probe waits some 700 iterations, not the ~34 the fits price.
  const int measured = iterations_with_probes(8, 300, 15.0);
  EXPECT_GE(measured, 1);
  EXPECT_LE(measured, 1) << measured << " of 300 iterations carried a probe";
  // Measured as cheap as the fits price them, they come as before.
  EXPECT_GE(iterations_with_probes(8, 300, 1.7), 5);
}

TEST(BatchProbes, RowsWaitingToProbeAreTappedOnlyBeforeTheirOwnTurn) {
  // A paused row is tapped in the four rounds before its probe. Eight rows whose probes must wait
  // for one another are each tapped before their own turn, not all of them before every turn
  // (where the taps of the rows whose probe was put off again bought nothing).
  const ProbeCounts c = count_probes(8, 600);
  EXPECT_GE(c.probes, 3);
  EXPECT_LE(c.tapped, 4 * c.probes + 8 * 4) << c.tapped << " tapped row-iterations for " << c.probes << " probes";
}

TEST(BatchProbes, ARowWhosePauseIsRenewedWithoutAProbeIsNotTapped) {
  // Costs that leave no depth paying even at full acceptance: a row's pauses are renewed without
  // a probe until its back-off reaches the cap, so it is not tapped before those pause ends.
  TargetView target;
  target.taps = true;
  Coordinator coordinator(target);
  coordinator.add_method("ngram", std::make_shared<TappingMethod>());
  SpecRow row;
  row.id = 0;
  row.method = "ngram";
  row.policy.emplace(3, true, 0.01);
  coordinator.join(row);
  // A window of two tokens costs three plain steps: nothing pays.
  CostModel costs;
  for (int i = 0; i < 80; ++i) costs.observe_forward(1 + i % 4, (0.3 + 0.9 * (i % 4)) * 1e-3);
  const SamplingParams greedy;
  int tapped = 0, probes = 0, rounds = 0;
  while (probes == 0 && rounds < 400) {
    const DraftAsk ask{&row, 5, 100 + rounds, 8, &greedy};
    coordinator.propose(std::span<const DraftAsk>(&ask, 1), costs, 1);
    tapped += coordinator.forward_taps(row).empty() ? 0 : 1;
    probes += row.policy->probing() ? 1 : 0;
    row.policy->observe(row.policy->probing() ? 1 : 0, 0);
    ++rounds;
  }
  // Pauses of 4, 8, 16 and 32 rounds renewed without a probe, then a forced probe at the cap:
  // tapped in its first round (a fresh row) and in the round before that probe only.
  EXPECT_EQ(probes, 1);
  EXPECT_LE(tapped, 2) << tapped << " tapped rounds of " << rounds;
}

// A method whose drafter computes two drafts a round while its rounds may reach six (the rest from
// the request's text, as a hidden-state drafter's): its rows record the depths they are asked.
class ReachMethod : public DraftMethod {
 public:
  struct Rows : DraftRows {
    int rows = 0;
    std::vector<int> asked;
    int row_count() const override { return rows; }
    PreparedChange prepare_append(std::span<const Checkpoint* const> checkpoints) override {
      const int n = static_cast<int>(checkpoints.size());
      return PreparedChange([this, n] { rows += n; }, [] {});
    }
    void filter_rows(std::span<const int> keep) override { rows = static_cast<int>(keep.size()); }
    void prefill(int, std::span<const int32_t>, const TargetContext&) override {}
    std::vector<DraftProposal> draft(std::span<const DraftRequestRow> asks) override {
      for (const DraftRequestRow& a : asks) asked.push_back(a.depth);
      return std::vector<DraftProposal>(asks.size());
    }
    void commit(std::span<const RowCommit>) override {}
    Checkpoint capture(int) const override { return {}; }
  };
  std::string name() const override { return "reach"; }
  std::string checkpoint_namespace() const override { return "reach-v1"; }
  std::unique_ptr<DraftRows> open(const TargetView&) override {
    auto r = std::make_unique<Rows>();
    rows = r.get();
    return r;
  }
  int default_depth() const override { return 6; }
  int own_depth() const override { return 2; }
  Rows* rows = nullptr;
};

TEST(Reach, ARoundAtTheDraftersOwnDepthAsksForTheRowsReach) {
  Coordinator coordinator(TargetView{});
  const auto method = std::make_shared<ReachMethod>();
  coordinator.add_method("reach", method);
  EXPECT_EQ(coordinator.own_depth("reach"), 2);
  const SamplingParams greedy;
  const CostModel costs = batch_costs(1);
  // A fixed-depth row drafts its policy's deepest (the method's own depth) and asks for its reach,
  // within what the row can take.
  SpecRow fixed;
  fixed.method = "reach";
  fixed.policy.emplace(2, false);
  fixed.reach = 6;
  coordinator.join(fixed);
  for (const int limit : {8, 4, 1}) {
    const DraftAsk ask{&fixed, 5, 100, limit, &greedy};
    coordinator.propose(std::span<const DraftAsk>(&ask, 1), costs, 1);
    ASSERT_FALSE(method->rows->asked.empty());
    EXPECT_EQ(method->rows->asked.back(), std::min(6, limit)) << "limit " << limit;
  }
  SpecRow* const gone[] = {&fixed};
  coordinator.leave(gone);
  // An adaptive row whose policy chose less than the drafter's own depth asks for just that.
  SpecRow adaptive;
  adaptive.method = "reach";
  adaptive.policy.emplace(2, true, 0.9);
  adaptive.reach = 6;
  coordinator.join(adaptive);
  std::vector<int> chosen, asked;
  for (int round = 0; round < 40; ++round) {
    const DraftAsk ask{&adaptive, 5, 100 + round, 8, &greedy};
    const size_t before = method->rows->asked.size();
    coordinator.propose(std::span<const DraftAsk>(&ask, 1), costs, 1);
    if (method->rows->asked.size() == before) continue;
    asked.push_back(method->rows->asked.back());
    adaptive.policy->observe(1, 1);
  }
  ASSERT_FALSE(asked.empty());
  for (const int d : asked) EXPECT_TRUE(d == 1 || d == 6) << d;
  EXPECT_NE(std::find(asked.begin(), asked.end(), 6), asked.end());
}

}  // namespace
}  // namespace specdec
