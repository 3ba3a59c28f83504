// The "never slower" policy: per row, pick the draft depth that maximises expected tokens per
// second from the measured acceptance and the measured costs of drafting and verifying, and
// pause speculation for a row where no depth beats a plain step. Costs are measured online
// because they differ by machine, model and batch, and move while the engine runs.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace specdec {

// Least squares of y on x with exponential forgetting: each new point weighs 1, earlier ones
// 0.97 times less per point. The forward costs and the draft costs are both fitted with it.
class ForgettingFit {
 public:
  void add(double x, double y);
  // Whether the recent x spread by at least `spread` (their weighted standard deviation), so
  // that a slope can be fitted.
  bool spreads(double spread) const { return variance() > spread * spread * sw_ * sw_; }
  double slope() const { return (sw_ * sxy_ - sx_ * sy_) / variance(); }
  // The intercept that goes with `slope`.
  double intercept(double slope) const { return (sy_ - slope * sx_) / sw_; }
  double mean_x() const { return sx_ / sw_; }
  double mean_y() const { return sy_ / sw_; }

 private:
  double variance() const { return sw_ * sxx_ - sx_ * sx_; }  // sw² times the weighted variance
  double sw_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
};

// Iteration costs, measured online. A target forward's cost is not a straight line in its token
// count: while a forward is bound by reading the weights, a few more tokens cost little (on a
// CPU, windows of up to three tokens stream the weights at about the cost of one), and past that
// every token adds its compute. So each token count up to kTable keeps its own measured cost
// (the median of its first forwards, then a moving average; the engine does not report forwards
// that paid one-off costs); a straight-line fit of seconds on tokens (fixed + per_token * T)
// prices the counts not measured yet (or measured only once), from the nearest measured count
// below. One per engine: every row's window is part of the same forward.
class CostModel {
 public:
  static constexpr int kTable = 64;

  // A model that prices a forward of T tokens at 1 + per_token * (T - 1) plain steps, whatever the
  // machine does: for rows whose depths may not depend on timing (a seeded rejection-mode row's
  // tokens depend on which positions it drafted).
  static CostModel fixed(double per_token);

  void observe_forward(int tokens, double seconds);
  // Cost of one row's window of `width` tokens in an iteration of `rows` rows: its share of an
  // iteration in which every row has a window that wide. The rows of a batch decide alike and
  // in the same iteration, so their windows add up: priced as the only extra tokens in the
  // forward, each row's window would look nearly free (the token counts just above a plain
  // iteration cost about what it does), every row would draft, and the forward would cost
  // several plain ones. For a straight-line cost both prices agree; they differ where the
  // measured table bends.
  double row_cost(int width, int rows) const;
  // Predicted seconds of a forward of `tokens` tokens.
  double forward_cost(int tokens) const;
  bool calibrated() const { return samples_ >= 4; }
  // How the machine's speed has moved since the first forwards (1: as then; 0.5: forwards take
  // half as long), learned from the counts measured: it prices every count, measured lately or
  // not, and the draft calls (DraftCost).
  double speed() const { return speed_; }
  // Whether windows of different widths have been seen, so that the per-token cost is measured
  // rather than assumed.
  bool slope_known() const { return slope_known_; }

 private:
  ForgettingFit fit_;  // seconds on tokens
  double fixed_ = 0, per_token_ = 0;
  int samples_ = 0;
  bool slope_known_ = false;                                   // some recent widths spread enough to fit the slope
  // Per token count, a moving average of its seconds divided by speed_: how the machine's speed
  // moves (other load on a shared host, a clock that changed) is learned from whichever counts
  // are measured and prices every count.
  std::array<double, kTable + 1> measured_{};
  double speed_ = 1.0;
  std::array<int, kTable + 1> seen_{};                         // forwards of each token count observed
  static constexpr int kWarm = 5;                              // a count's first forwards, priced by their median
  std::array<std::array<double, kWarm>, kTable + 1> first_{};  // each count's first forwards, sorted
};

// Seconds of one draft method's call, measured online: a fixed part per call and a part per
// step of depth, fitted like the forward costs (least squares with forgetting, refitted while
// the depths seen spread). The fixed part is what a call pays whatever its depth: a draft model
// first feeds the tokens the last round emitted. Priced per drafted token instead, a shallow
// call spreads its fixed part over few tokens, so a row that drafts shallow sees deep rounds
// priced at its shallow rate per token, finds them dear, and stays shallow for good. One per
// method group: an n-gram lookup costs next to nothing where a draft model's step costs a
// sizeable part of a target step, and one figure for both would misprice each.
class DraftCost {
 public:
  // How a call's time grows with its depth where the calls seen cannot tell (one depth seen): a
  // forward per draft after one for the last round's tokens (a draft model, a chained head), or
  // one forward for the whole block whatever the depth (a block drafter).
  enum class Shape { per_draft, per_block };
  // `own_depth`: the most drafts a call's drafter computes itself (DraftMethod::own_depth); a
  // call asked deeper costs as one of that depth.
  explicit DraftCost(Shape shape = Shape::per_draft, int own_depth = std::numeric_limits<int>::max())
      : own_depth_(std::max(1, own_depth)), shape_(shape) {}
  // Calls priced at fixed + per_step * depth whatever the machine does (CostModel::fixed's
  // companion).
  static DraftCost fixed(Shape shape, double fixed, double per_step, int own_depth = std::numeric_limits<int>::max());
  // One call that drafted up to `depth` tokens a row; `seconds` is one row's share of its time.
  // Its rows draft in parallel: a call of eight rows costs more than one of a single row but far
  // less than eight of them, so the share is measured at the batch the engine runs. `speed` is
  // the machine's speed then (CostModel::speed): a row that stops drafting stops measuring its
  // calls, while the forwards go on measuring how the machine's speed moves (other load that
  // came or went), and the calls' prices follow that (cost's `speed`). Measured in a disturbed
  // minute and priced as then, drafting would look dear next to the re-measured forwards, and a
  // row paused in that minute would not draft again.
  void observe(int depth, double seconds, double speed = 1.0);
  // A call that also paid for more than its drafts (it caught a row up on the rounds of a pause,
  // or recorded a new shape): its time bounds a usual call's from above, so it counts only where
  // it is below the price. A row that is paused probes only with such calls, and a price measured
  // in a disturbed minute would otherwise never come down.
  void observe_bound(int depth, double seconds, double speed = 1.0);
  // A row's share of a call of depth k, at the machine's speed `speed`.
  double cost(int k, double speed = 1.0) const {
    return k <= 0 ? 0.0 : speed * (fixed_ + per_step_ * std::min(k, own_depth_));
  }

 private:
  int own_depth_;
  ForgettingFit fit_;  // seconds on depth
  double fixed_ = 0, per_step_ = 0;
  int calls_ = 0;  // calls observed
  bool slope_known_ = false;  // calls of spread depths have fitted the per-step part
  Shape shape_;
};

// One per speculating row: learns the row's acceptance from its own rounds and chooses each
// round's depth against the engine's CostModel and the row's method's DraftCost. Acceptance is
// per row because it depends on the text being generated, not on the method alone.
class DepthPolicy {
 public:
  DepthPolicy(int max_depth, bool adaptive, double prior_acceptance = 0.6);
  // Depth for the next round (0 = a plain target step this round). A paused row whose pause
  // ends probes at the depth with the best rate on its estimates. Where the measured costs say
  // no depth could pay, that probe drafts one token and goes out only at the back-off cap and
  // only while *forced_probes_left > 0 (then it takes one; null = no limit): the engine allows
  // one such probe per method group and iteration.
  int next_depth(const CostModel& costs, const DraftCost& draft, int rows, int* forced_probes_left = nullptr);
  // The round's outcome: drafts proposed and accepted (proposed 0 = nothing to learn).
  void observe(int drafted, int accepted);
  // Estimated acceptance of the next round's first draft.
  double acceptance() const { return cond_[run_].empty() ? 0.0 : estimate(0); }
  int max_depth() const { return max_depth_; }
  // Whether it chooses the depth (else every round drafts max_depth()).
  bool adaptive() const { return adaptive_ && max_depth_ > 0; }
  // Expected tokens the next round emits with k drafts: 1 + sum over j <= k of P(first j accepted).
  double expected_emitted(int k) const { return expected_emitted(k, run_); }
  // Whether some depth would beat a plain step if every draft were accepted.
  bool could_pay(const CostModel& costs, const DraftCost& draft, int rows) const;
  // After this round's next_depth: how many rounds ahead the next one that may draft is (1: the
  // next round; a pause of p rounds starts at p). A hidden-state drafter's row needs the target's
  // taps only in the rounds just before one that drafts.
  int rounds_to_draft() const { return max_depth_ == 0 ? kNever : std::max(1, paused_); }
  // How many of the coming rounds draft nothing whatever the costs and the text say: the rest of
  // a pause before the round that ends it (kNever for a row that never drafts). A step for such a
  // round needs nothing from the round before it, and may be launched before that one's tokens
  // are known.
  int plain_rounds() const;
  // Whether the row is paused because the measured costs leave no depth that would pay even if
  // every draft were accepted: the probe that ends the pause then re-measures the costs, and
  // what it accepts cannot resume drafting.
  bool cannot_pay() const { return paused_ > 0 && cannot_pay_; }
  // Whether such a pause ends in a probe all the same (its back-off is at the cap); otherwise,
  // unless the costs change meanwhile, it is renewed without one.
  bool probe_forced() const { return backoff_ >= kMaxBackoff; }
  // Whether the last next_depth() ended a pause with a probe.
  bool probing() const { return probing_; }
  // Puts off the probe the last next_depth() asked for by `rounds` rounds (at least one),
  // leaving the back-off as it is: in a batch, a group's rows probe one at a time.
  void defer_probe(int rounds);
  static constexpr int kNever = 1 << 30;
  static constexpr int kMaxBackoff = 64;  // rounds: the longest pause between probes

 private:
  // P(draft i accepted | drafts before it accepted) in regime `regime` (default: the current one).
  double estimate(std::size_t i) const { return estimate(i, run_); }
  double estimate(std::size_t i, int regime) const;
  double expected_emitted(int k, int regime) const;
  // Fills choices_: for each regime and depth k (0 = a plain step), a round's expected tokens,
  // its seconds and the chance it is accepted whole; priced once a round for both of
  // next_depth's decisions (policy work is host time every GPU iteration waits for).
  void price_choices(const CostModel& costs, const DraftCost& draft, int rows);
  // The depth of at least `least` with the best rate for the current regime's next round alone,
  // from choices_ (0 only where it beats every depth by kMinGain).
  int best_rate_depth(int least) const;
  // The depth for the current regime that maximises the long-run rate over both regimes, from
  // choices_.
  int long_run_depth() const;
  // Pauses speculation for backoff_ rounds and doubles the next pause (up to the cap).
  void pause();

  int max_depth_;
  bool adaptive_;
  // cond_[r][i]: P(draft i accepted | drafts before it accepted), in regime r = whether the last
  // round that drafted had all its drafts accepted. Acceptance is bursty twice over: a copied
  // span is accepted whole (hence per-position conditionals rather than one geometric rate), and
  // a round that follows a fully accepted one is usually still inside the span being copied,
  // while one that follows a rejection usually starts where the copy broke off.
  std::vector<double> cond_[3];  // [2]: both regimes pooled
  std::vector<int> seen_[3];     // rounds that tried each position, per regime (and pooled)
  int run_ = 0;
  int paused_ = 0;           // rounds left before speculation is probed again
  bool cannot_pay_ = false;  // the last pricing found no depth that could pay at full acceptance
  int backoff_ = 4;          // length of the next pause
  bool wide_probe_ = false;  // alternates the depths drafted while the cost slope is unknown
  bool probing_ = false;     // the last next_depth() was a pause's probe
  struct Choice {
    double emitted, seconds, full;  // per round; full: P(the next round is in regime 1)
  };
  std::array<std::vector<Choice>, 2> choices_;  // price_choices' result, per regime
};

}  // namespace specdec
