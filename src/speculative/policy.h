// The "never slower" policy: per row, pick the draft depth that maximises expected tokens per
// second from the measured acceptance and the measured costs of drafting and verifying, and
// pause speculation for a row where no depth beats a plain step.
#pragma once

#include <cstdint>
#include <vector>

namespace specdec {

// Iteration costs, fitted online: a target forward of T tokens over R rows costs about
// fixed + per_token * T seconds; drafting costs per_draft seconds per drafted token.
class CostModel {
 public:
  void observe_forward(int tokens, double seconds);
  void observe_draft(int drafted_tokens, double seconds);
  // Marginal cost of one row's window of `width` tokens in an iteration of `rows` rows.
  double row_cost(int width, int rows) const;
  double draft_cost(int tokens) const { return per_draft_ * tokens; }
  bool calibrated() const { return samples_ >= 4; }
  // Whether windows of different widths have been seen, so that the per-token cost is measured
  // rather than assumed.
  bool slope_known() const { return slope_known_; }

 private:
  // Exponentially weighted least squares of seconds on tokens.
  double sw_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
  double fixed_ = 0, per_token_ = 0, per_draft_ = 0;
  int samples_ = 0;
  bool slope_known_ = false;  // some recent widths spread enough to fit the slope
  bool draft_seen_ = false;
};

class DepthPolicy {
 public:
  DepthPolicy(int max_depth, bool adaptive, double prior_acceptance = 0.6);
  // Depth for the next round (0 = a plain target step this round).
  int next_depth(const CostModel& costs, int rows);
  // The round's outcome: drafts proposed and accepted (proposed 0 = nothing to learn).
  void observe(int drafted, int accepted);
  // Estimated acceptance of the next round's first draft.
  double acceptance() const { return cond_[run_].empty() ? 0.0 : cond_[run_][0]; }
  int max_depth() const { return max_depth_; }
  // Expected tokens the next round emits with k drafts: 1 + sum over j <= k of P(first j accepted).
  double expected_emitted(int k) const;

 private:
  int max_depth_;
  bool adaptive_;
  // cond_[r][i]: P(draft i accepted | drafts before it accepted), in regime r = whether the last
  // round that drafted had all its drafts accepted. Acceptance is bursty twice over: a copied
  // span is accepted whole (hence per-position conditionals rather than one geometric rate), and
  // a round that follows a fully accepted one is usually still inside the span being copied,
  // while one that follows a rejection usually starts where the copy broke off.
  std::vector<double> cond_[2];
  int run_ = 0;
  int paused_ = 0;           // rounds left before speculation is probed again
  int backoff_ = 4;          // length of the next pause
  bool wide_probe_ = false;  // alternates the depths drafted while the cost slope is unknown
};

}  // namespace specdec
