// The replay of speculative rounds against recorded outcomes: plain decoding, a fixed depth
// and the best schedule, each checked against a count by hand; the adaptive policy never beats
// the best schedule.
#include <gtest/gtest.h>

#include <random>

#include "speculative/replay.h"

namespace specdec {
namespace {

// Widths 1..4 cost 1.0, 1.2, 1.4, 1.6 ms.
ReplayCosts costs(double draft_fixed = 0, double draft_step = 0) {
  ReplayCosts c;
  c.forward = {0, 1.0e-3, 1.2e-3, 1.4e-3, 1.6e-3};
  c.draft_fixed = draft_fixed;
  c.draft_step = draft_step;
  return c;
}

// Eleven tokens; rounds at 1 and 6 would have three drafts accepted, and so on down.
ReplayTrace trace() { return ReplayTrace{{0, 3, 2, 1, 0, 0, 3, 2, 1, 0, 0}, {}}; }

TEST(Replay, PlainDecodingIsOneStepPerTokenAfterTheFirst) {
  EXPECT_NEAR(replay_plain(trace(), costs()), 10 * 1.0e-3, 1e-12);
}

TEST(Replay, ForwardsPastTheTableGrowByItsLastStep) { EXPECT_NEAR(costs().forward_cost(6), 2.0e-3, 1e-12); }

TEST(Replay, AFixedDepthIsChargedItsDraftsAndWindows) {
  // Depth 2, draft calls 0.1 + 0.05 per step: rounds at 1 (2 accepted), 4 (0), 5 (0), 6 (2) cost
  // 0.2 + 1.4 each; the round at 9 may draft one token (10 is the last), rejected: 0.15 + 1.2;
  // the round at 10 drafts nothing: 1.0.
  const ReplayResult r = replay_policy(trace(), costs(0.1e-3, 0.05e-3), 2, false);
  EXPECT_NEAR(r.seconds, 4 * 1.6e-3 + 1.35e-3 + 1.0e-3, 1e-12);
  EXPECT_EQ(r.rounds, 6);
  EXPECT_EQ(r.drafted, 9);
  EXPECT_EQ(r.accepted, 4);
}

TEST(Replay, TheBestScheduleDraftsExactlyWhatIsAccepted) {
  // At 1: three drafts, all accepted (1.6); at 5 nothing is accepted, so a plain step (1.0); at
  // 6 three again (1.6); at 10 the last token (1.0).
  const ReplayResult r = replay_best(trace(), costs(), 3);
  EXPECT_NEAR(r.seconds, 5.2e-3, 1e-12);
  EXPECT_EQ(r.rounds, 4);
  EXPECT_EQ(r.drafted, 6);
  EXPECT_EQ(r.accepted, 6);
}

TEST(Replay, ProposalsCapTheDrafts) {
  // An n-gram method offers at most one draft where nothing longer matched.
  ReplayTrace t = trace();
  t.proposal.assign(t.run.size(), 1);
  const ReplayResult r = replay_policy(t, costs(), 3, false);
  EXPECT_LE(r.drafted, r.rounds);
  EXPECT_EQ(replay_best(t, costs(), 3).drafted, replay_best(t, costs(), 1).drafted);
}

TEST(Replay, NoPolicyBeatsTheBestSchedule) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    ReplayTrace t;
    t.run.assign(200, 0);
    for (int i = 199; i >= 0; --i) t.run[i] = (rng() % 3 != 0 && i + 1 < 200) ? t.run[i + 1] + 1 : 0;
    ReplayCosts c = costs(0.05e-3, 0.1e-3);
    c.forward = {0, 0.65e-3, 0.69e-3, 0.79e-3, 0.99e-3, 1.12e-3, 1.25e-3, 1.46e-3, 1.56e-3, 1.82e-3};
    const double best = replay_best(t, c, 8).seconds;
    EXPECT_GE(replay_policy(t, c, 8, true).seconds, best - 1e-12);
    for (int depth = 1; depth <= 8; ++depth) EXPECT_GE(replay_policy(t, c, depth, false).seconds, best - 1e-12);
    EXPECT_LT(best, replay_plain(t, c));
  }
}

}  // namespace
}  // namespace specdec
