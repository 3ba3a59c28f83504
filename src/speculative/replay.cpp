// The replay of a request's rounds: the engine's loop for one row (policy, draft call, verify
// window, outcome) with the clock replaced by measured costs.
#include "speculative/replay.h"

#include <algorithm>

#include "core/error.h"
#include "speculative/policy.h"

namespace specdec {

double ReplayCosts::forward_cost(int w) const {
  const int widths = static_cast<int>(forward.size()) - 1;
  SPECDEC_CHECK(widths >= 1 && w >= 1, "replay: forward costs need widths from 1, asked for ", w);
  if (w <= widths) return forward[static_cast<size_t>(w)];
  const double step =
      widths >= 2 ? forward[static_cast<size_t>(widths)] - forward[static_cast<size_t>(widths - 1)] : 0.0;
  return forward[static_cast<size_t>(widths)] + step * (w - widths);
}

double replay_plain(const ReplayTrace& trace, const ReplayCosts& costs) {
  return std::max(0, trace.size() - 1) * costs.forward_cost(1);
}

namespace {

void check(const ReplayTrace& trace) {
  SPECDEC_CHECK(trace.proposal.empty() || trace.proposal.size() == trace.run.size(),
                "replay: a trace's proposal lengths must cover its ", trace.run.size(), " positions");
}

// Drafts the method offers in a round at t that asks for `depth`.
int offered(const ReplayTrace& trace, int t, int depth) {
  return trace.proposal.empty() ? depth : std::min(depth, trace.proposal[static_cast<size_t>(t)]);
}

double draft_call(const ReplayCosts& costs, int depth) {
  return depth > 0 ? costs.draft_fixed + costs.draft_step * depth : 0.0;
}

ReplayResult replay_once(const ReplayTrace& trace, const ReplayCosts& costs, int max_depth, bool adaptive,
                         CostModel& forwards, DraftCost& drafts) {
  DepthPolicy policy(max_depth, adaptive);
  ReplayResult r;
  const int n = trace.size();
  bool behind = false;  // the row skipped drafting since its last draft call
  for (int t = 1; t < n;) {
    int forced_probes = 1;
    const int depth = std::min(policy.next_depth(forwards, drafts, 1, &forced_probes), n - t - 1);
    int k = 0;
    if (depth > 0) {
      k = offered(trace, t, depth);
      double seconds = draft_call(costs, depth);
      // As the engine: a call that also caught the row up is not a price of drafting.
      if (behind) {
        seconds += costs.catch_up;
      } else {
        drafts.observe(k, seconds, forwards.speed());
      }
      r.seconds += seconds;
      behind = false;
    } else {
      behind = true;
    }
    const int accepted = std::min(k, trace.run[static_cast<size_t>(t)]);
    const double forward = costs.forward_cost(k + 1);
    r.seconds += forward;
    forwards.observe_forward(k + 1, forward);
    policy.observe(k, accepted);
    ++r.rounds;
    r.drafted += k;
    r.accepted += accepted;
    t += accepted + 1;
  }
  return r;
}

}  // namespace

ReplayResult replay_policy(const ReplayTrace& trace, const ReplayCosts& costs, int max_depth, bool adaptive) {
  check(trace);
  CostModel forwards;
  DraftCost drafts;
  replay_once(trace, costs, max_depth, adaptive, forwards, drafts);
  return replay_once(trace, costs, max_depth, adaptive, forwards, drafts);
}

ReplayResult replay_best(const ReplayTrace& trace, const ReplayCosts& costs, int max_depth) {
  check(trace);
  const int n = trace.size();
  // best[t]: the least time from a round at t to the end; pick[t]: its depth.
  std::vector<double> best(static_cast<size_t>(std::max(n, 1) + 1), 0.0);
  std::vector<int> pick(best.size(), 0);
  for (int t = n - 1; t >= 1; --t) {
    double least = -1;
    for (int depth = 0; depth <= std::min(max_depth, n - t - 1); ++depth) {
      const int k = offered(trace, t, depth);
      const int next = t + std::min(k, trace.run[static_cast<size_t>(t)]) + 1;
      const double seconds =
          draft_call(costs, depth) + costs.forward_cost(k + 1) + (next < n ? best[static_cast<size_t>(next)] : 0.0);
      if (least < 0 || seconds < least) {
        least = seconds;
        pick[static_cast<size_t>(t)] = depth;
      }
    }
    best[static_cast<size_t>(t)] = least;
  }
  ReplayResult r;
  r.seconds = n > 1 ? best[1] : 0.0;
  for (int t = 1; t < n;) {
    const int k = offered(trace, t, pick[static_cast<size_t>(t)]);
    const int accepted = std::min(k, trace.run[static_cast<size_t>(t)]);
    ++r.rounds;
    r.drafted += k;
    r.accepted += accepted;
    t += accepted + 1;
  }
  return r;
}

}  // namespace specdec
