// Replays a request's speculative decoding against recorded acceptance and measured costs, so
// that depth policies can be compared without timing noise, and against the best any policy
// could do. With greedy sampling a request's tokens are fixed (the output equals plain
// decoding), and so is what a method proposes at each point of it: a round whose first draft
// stands for generated token t has its first run[t] drafts accepted, whatever depth it asks
// for. The replay charges each round what it would cost (a target forward of its window, a
// draft call) and feeds those costs and outcomes to the policy as the engine does.
#pragma once

#include <vector>

namespace specdec {

// Seconds, measured on the machine replayed.
struct ReplayCosts {
  std::vector<double> forward;  // forward[w]: a target forward of a one-row window of w tokens (w >= 1)
  double draft_fixed = 0;       // a draft call of depth k >= 1: draft_fixed + draft_step * k
  double draft_step = 0;
  double catch_up = 0;  // extra for a draft call after rounds the row did not draft in
  // A forward of w tokens; past the table, its last width plus its last step per token.
  double forward_cost(int w) const;
};

// One request's outcome at every point: generated tokens 0 .. size() - 1 (token 0 comes from the
// prefill; rounds start at t >= 1).
struct ReplayTrace {
  std::vector<int> run;       // run[t]: drafts accepted in a round whose first draft is token t
  std::vector<int> proposal;  // proposal[t]: most drafts the method offers there; empty = any depth
  int size() const { return static_cast<int>(run.size()); }
};

struct ReplayResult {
  double seconds = 0;  // decode phase: the rounds after the first token
  int rounds = 0;
  int drafted = 0;
  int accepted = 0;
  // Tokens a target forward emits on average.
  double tokens_per_forward() const { return rounds ? 1.0 * (accepted + rounds) / rounds : 0.0; }
};

// Plain decoding of the trace's tokens after the first: one forward of one token each.
double replay_plain(const ReplayTrace& trace, const ReplayCosts& costs);
// The default depth policy (adaptive) or a fixed depth, replayed. The policy's cost figures are
// first warmed by one replay of the same trace, as a serving engine's are by earlier requests.
ReplayResult replay_policy(const ReplayTrace& trace, const ReplayCosts& costs, int max_depth, bool adaptive);
// The least decode time any sequence of depths achieves, knowing every round's outcome ahead
// (dynamic programming over the generated positions): the bound on what a policy can gain.
ReplayResult replay_best(const ReplayTrace& trace, const ReplayCosts& costs, int max_depth);

}  // namespace specdec
