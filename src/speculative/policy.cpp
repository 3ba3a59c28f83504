// The depth policy's estimators and choice. With per-position acceptance a, a window of k drafts
// emits on average (1 - a^(k+1)) / (1 - a) tokens; its cost is the row's verify width k + 1 plus
// a draft call of depth k. Every estimate here is built so that one bad timing or one unlucky
// round cannot fix it for good: a wrong estimate seals itself, since a depth priced too dear is
// never chosen again and so never measured again.
#include "speculative/policy.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace specdec {

namespace {
constexpr double kDecay = 0.97;       // forgetting factor of the cost fits
constexpr double kAlphaRate = 0.2;    // EMA rate of the acceptance estimate
constexpr double kMinGain = 1.03;     // speculate only when it is expected to pay by 3 %: a margin
                                      // for noise in the measured costs, small enough not to pause
                                      // a row where speculation pays
constexpr double kMaxSpike = 2.0;     // an observed forward counts at most this many predictions
constexpr double kMinSpread = 0.5;    // tokens: spread of recent widths needed to refit the slope
constexpr double kLaterPrior = 0.85;  // prior acceptance of drafts after the first
constexpr double kRelax = 0.1;        // per round, untried positions' drift back to that prior
constexpr double kTableRate = 0.02;   // moving-average rate of each token count's own figure
constexpr double kSpeedRate = 0.08;   // and of the speed every count shares (four fifths of a change)
constexpr int kMinBackoff = 4;        // rounds: the shortest pause (DepthPolicy::backoff_ starts there)
constexpr double kShrink = 3.0;       // rounds of a regime's own evidence that weigh as much as the pooled estimate
}  // namespace

void ForgettingFit::add(double x, double y) {
  sw_ = sw_ * kDecay + 1;
  sx_ = sx_ * kDecay + x;
  sy_ = sy_ * kDecay + y;
  sxx_ = sxx_ * kDecay + x * x;
  sxy_ = sxy_ * kDecay + x * y;
}

void CostModel::observe_forward(int tokens, double seconds) {
  // Timings on a shared machine have a heavy right tail (a descheduled pool worker costs a whole
  // scheduler slice). Once calibrated, one observation may count at most kMaxSpike times the
  // prediction: a lone spike then moves the fit a little instead of pausing speculation for
  // dozens of rounds, while a lasting change still pulls the fit all the way within a few rounds.
  if (calibrated()) seconds = std::min(seconds, kMaxSpike * forward_cost(tokens));
  if (tokens >= 1 && tokens <= kTable) {
    double& m = measured_[static_cast<size_t>(tokens)];
    int& n = seen_[static_cast<size_t>(tokens)];
    // The median of the first observations, then a moving average. A count's first forwards
    // are the slow ones (a new width grows buffers and faults their pages; on a GPU a replayed
    // step's first runs go call by call and then record), and a mean of them would set the
    // count's price too dear for the rest of an engine's life: a row that drafts every round
    // never measures a plain step again.
    if (n < kWarm) {
      // Kept sorted: insert this one, then take the lower median of the n + 1 seen.
      std::array<double, kWarm>& first = first_[static_cast<size_t>(tokens)];
      const double v = seconds / speed_;
      auto i = static_cast<size_t>(n);
      for (; i > 0 && first[i - 1] > v; --i) first[i] = first[i - 1];
      first[i] = v;
      m = first[static_cast<size_t>(n / 2)];
    } else {
      // Most of a settled count's surprise moves the machine's speed, and with it every count's
      // price: a width that is no longer drafted is never measured again, and its figure from a
      // minute in which other load held the cores would otherwise stand for good (pricing the
      // windows of that width as dear as then, so that they are never chosen). The rest moves
      // the count's own figure, so that a count's price still converges on what it costs.
      const double q = std::clamp(seconds / (m * speed_), 1.0 / kMaxSpike, kMaxSpike);
      speed_ *= std::pow(q, kSpeedRate);
      m += kTableRate * (std::min(seconds / speed_, kMaxSpike * m) - m);
    }
    n = std::min(n + 1, 1000);
  }
  fit_.add(tokens, seconds);
  ++samples_;
  // The slope is refitted only while the recent widths spread by at least kMinSpread tokens:
  // after a long run of equal plain steps (speculation paused) one probe among them would
  // otherwise set the slope from a single noisy sample, or the spread would vanish and the slope
  // with it, so that drafting looked free and the policy resumed, paid, and paused again.
  // Between such phases the slope learned last is kept and only the intercept follows the
  // timings.
  if (fit_.spreads(kMinSpread)) {
    per_token_ = std::max(0.0, fit_.slope());
    slope_known_ = true;
  }
  if (slope_known_) {
    fixed_ = std::max(0.0, fit_.intercept(per_token_));
  } else {
    // No spread seen yet: attribute the cost to the fixed part (weights read once per iteration
    // dominate a memory-bound forward) until windows of other widths show the slope.
    fixed_ = fit_.mean_y();
    per_token_ = 0.02 * fixed_ / std::max(1.0, fit_.mean_x());
  }
}

CostModel CostModel::fixed(double per_token) {
  // Every count's first forwards at its price: the table and the fit then hold exactly these
  // prices, and the machine's speed stays 1.
  CostModel m;
  for (int round = 0; round < kWarm; ++round)
    for (int t = 1; t <= kTable; ++t) m.observe_forward(t, 1.0 + per_token * (t - 1));
  return m;
}

DraftCost DraftCost::fixed(Shape shape, double fixed, double per_step, int own_depth) {
  DraftCost d(shape, own_depth);
  for (int round = 0; round < 2; ++round)
    for (int k = 1; k <= 8; ++k) d.observe(k, fixed + per_step * std::min(k, d.own_depth_));
  return d;
}

void DraftCost::observe(int depth, double seconds, double speed) {
  if (depth <= 0) return;
  depth = std::min(depth, own_depth_);
  // Kept in the speed of the machine's first forwards (cost() prices at the speed of the moment).
  seconds /= speed;
  // The first call runs on cold caches (a draft model's first steps after a request's prefill
  // are far slower than its steady ones), so it prices drafts only until the second call
  // replaces it. Later, one call counts at most twice its prediction: a descheduled thread must
  // not pause speculation for dozens of rounds.
  if (calls_ == 1) fit_ = ForgettingFit{};
  if (calls_ >= 2) seconds = std::min(seconds, kMaxSpike * cost(depth));
  calls_ = std::min(calls_ + 1, 1000);
  fit_.add(depth, seconds);
  if (fit_.spreads(kMinSpread)) {
    const double slope = fit_.slope();
    const double intercept = fit_.intercept(slope);
    if (slope > 0 && intercept >= 0) {
      per_step_ = slope;
      fixed_ = intercept;
      slope_known_ = true;
      return;
    }
  }
  // Once calls of spread depths have shown the per-step part, it stands while the depths seen
  // stop spreading (a row settled at one depth), and only the fixed part follows the timings, as
  // the forward costs do. Split again by the method's shape instead, a chain whose fixed part
  // (feeding the last round's positions) is several steps long would see its deep calls priced
  // at the settled depth's cost per step, find them dear, and stay at that depth for good.
  if (slope_known_) {
    fixed_ = std::max(0.0, fit_.intercept(per_step_));
    return;
  }
  // One depth seen (or a fit that makes no sense on noisy calls): the mean call split by the
  // method's shape. A draft model's call is a call of that depth plus one step for its fixed
  // part (it feeds the last round's tokens in a forward of its own). A block drafter's call is
  // one forward whatever the depth: split per draft, its deep rounds would be priced at several
  // such forwards and its shallow ones at a fraction of one, so the policy would keep it shallow
  // or paused where deep rounds pay.
  if (shape_ == Shape::per_block) {
    per_step_ = 0;
    fixed_ = fit_.mean_y();
    return;
  }
  per_step_ = fit_.mean_y() / (fit_.mean_x() + 1);
  fixed_ = per_step_;
}

void DraftCost::observe_bound(int depth, double seconds, double speed) {
  if (depth > 0 && calls_ >= 2 && seconds < cost(depth, speed)) observe(depth, seconds, speed);
}

double CostModel::forward_cost(int tokens) const {
  tokens = std::max(1, tokens);
  // The nearest count at or below `tokens` measured more than once, plus the fitted slope for
  // the rest; then one measured once; the fit alone when none has been measured. A count's
  // first forwards are not a fair price of it: the first forward of a new, larger width grows
  // the model's buffers and pays their page faults, and an engine's first iterations may all be
  // slow; a width priced by such figures is not chosen again, so they would stand for good. So
  // a count seen fewer than kWarm times is priced at most as the nearest settled count below it
  // extrapolates: it is chosen where it would pay, measured, and settles at its own median.
  const auto from = [&](int t) { return measured_[static_cast<size_t>(t)] * speed_ + per_token_ * (tokens - t); };
  const auto settled_below = [&](int t) {
    for (int s = t - 1; s >= 1; --s)
      if (seen_[static_cast<size_t>(s)] >= kWarm) return from(s);
    return std::numeric_limits<double>::infinity();
  };
  for (int need : {2, 1})
    for (int t = std::min(tokens, kTable); t >= 1; --t) {
      const int seen = seen_[static_cast<size_t>(t)];
      if (seen >= need) return seen < kWarm ? std::min(from(t), settled_below(t)) : from(t);
    }
  return fixed_ + per_token_ * tokens;
}

double CostModel::row_cost(int width, int rows) const {
  rows = std::max(1, rows);
  return forward_cost(rows * std::max(1, width)) / rows;
}

DepthPolicy::DepthPolicy(int max_depth, bool adaptive, double prior_acceptance)
    : max_depth_(std::max(0, max_depth)), adaptive_(adaptive) {
  // Later positions start optimistic: acceptance is bursty (a draft that followed accepted ones
  // is usually right), and an optimistic prior makes the policy try the depth it must price.
  for (std::vector<double>& cond : cond_) {
    cond.assign(static_cast<size_t>(max_depth_), kLaterPrior);
    if (!cond.empty()) cond[0] = prior_acceptance;
  }
  for (std::vector<int>& seen : seen_) seen.assign(static_cast<size_t>(max_depth_), 0);
}

// Seconds of one row's round with k drafts: its verify window of k + 1 tokens and the drafts.
static double round_cost(const CostModel& costs, const DraftCost& draft, int rows, int k) {
  return costs.row_cost(k + 1, rows) + draft.cost(k, costs.speed());
}

bool DepthPolicy::could_pay(const CostModel& costs, const DraftCost& draft, int rows) const {
  const double plain_rate = 1.0 / costs.row_cost(1, rows);
  for (int k = 1; k <= max_depth_; ++k)
    if ((k + 1) / round_cost(costs, draft, rows, k) > plain_rate * kMinGain) return true;
  return false;
}

void DepthPolicy::pause() {
  paused_ = backoff_;
  backoff_ = std::min(backoff_ * 2, kMaxBackoff);
}

double DepthPolicy::estimate(size_t i, int regime) const {
  // The regime's own estimate, shrunk toward the estimate over both regimes in proportion to
  // how often the regime tried the position (kShrink tries weigh as much as the pooled figure).
  // Split two ways, a request's few dozen rounds leave each regime few observations, and two
  // unlucky rounds in one regime must not pause a row that pays overall (a pause costs several
  // plain rounds). A regime that has not tried a position takes the pooled estimate outright:
  // otherwise, on a row that rarely accepts, one accepted probe would move it into the
  // after-a-full-accept regime, whose untouched optimistic priors would ask for a deep round
  // that is then rejected whole.
  const double n = seen_[regime][i];
  const double w = n / (n + kShrink);
  return w * cond_[regime][i] + (1 - w) * cond_[2][i];
}

double DepthPolicy::expected_emitted(int k, int regime) const {
  double total = 1.0, reach = 1.0;
  for (size_t i = 0; i < static_cast<size_t>(k) && i < cond_[regime].size(); ++i) {
    reach *= estimate(i, regime);
    total += reach;
  }
  return total;
}

void DepthPolicy::defer_probe(int rounds) {
  probing_ = false;
  paused_ = std::max(1, rounds);
}

int DepthPolicy::plain_rounds() const {
  if (max_depth_ == 0) return kNever;
  // next_depth() counts a pause down and returns 0 until its last round, which may probe.
  return adaptive_ ? std::max(0, paused_ - 1) : 0;
}

int DepthPolicy::next_depth(const CostModel& costs, const DraftCost& draft, int rows, int* forced_probes_left) {
  probing_ = false;
  if (!adaptive_ || max_depth_ == 0) return max_depth_;
  if (paused_ > 0) {
    --paused_;
    if (paused_ > 0) return 0;
    // The pause ends with a probe of one draft, unless the measured costs leave no depth that
    // would pay even if every draft were accepted: then a probe can only lose (and a draft
    // model's probe first catches up on every token of the pause). The pause is renewed.
    // Until the back-off reaches its cap; then a probe goes out anyway, so that a row whose
    // costs were measured in a bad minute is not held off for good. Such forced probes are
    // rationed: the rows of a batch start together and reach the cap in the same iteration, and
    // a draft model's probe first catches its row up on the whole pause, so all of them probing
    // at once costs a long draft call that no accepted draft can repay.
    cannot_pay_ = costs.calibrated() && costs.slope_known() && !could_pay(costs, draft, rows);
    if (cannot_pay_) {
      const bool forced = backoff_ >= kMaxBackoff && (!forced_probes_left || *forced_probes_left > 0);
      if (!forced) {
        pause();
        return 0;
      }
      if (forced_probes_left) --*forced_probes_left;
    }
    probing_ = true;
    // A probe drafts whatever the estimates say, but not necessarily one token: at the depth
    // with the best rate, as a round that drafts at all would. Where a window's extra tokens
    // cost little beside the call (a block drafter's call is one forward whatever the depth; a
    // GPU's windows of a few tokens cost about one step), a single-token probe learns one
    // position and wins one token on text the drafter has started to get right (a loop, a
    // copy), and takes several pauses to climb back to drafting there. A probe that can only
    // re-measure costs stays at one draft.
    if (cannot_pay_ || !costs.calibrated() || !costs.slope_known()) return 1;
    price_choices(costs, draft, rows);
    return best_rate_depth(1);
  }
  // Until the cost fit has data, draft moderately: a full-depth window in every row of a big
  // batch is the most expensive way to learn that speculation does not pay there. Until windows
  // of different widths have shown what a drafted token costs, the fit charges almost nothing
  // for one, so depths alternate between 1 and 3 (widths 2 and 4, which give the fit its
  // slope): otherwise the first proposals would be drafted to full depth at any acceptance, and
  // on a row that never pays its first rounds would reject whole deep windows.
  if (!costs.calibrated() || !costs.slope_known()) {
    wide_probe_ = !wide_probe_;
    return std::min(max_depth_, wide_probe_ ? 3 : 1);
  }
  // Whether to draft: the best depth for this round alone against a plain step.
  price_choices(costs, draft, rows);
  const int best = best_rate_depth(0);
  if (best == 0) {
    cannot_pay_ = !could_pay(costs, draft, rows);
    pause();
    return 0;
  }
  cannot_pay_ = false;
  // A round that drafts halves the next pause rather than resetting it: on a row whose drafts are
  // rarely accepted, one lucky probe would otherwise restart the back-off at its shortest, and
  // the probes of the short pauses that follow cost more than they win. A row that goes on
  // drafting is back at the shortest pause within a few rounds.
  backoff_ = std::max(kMinBackoff, backoff_ / 2);
  return std::max(best, long_run_depth());
}

void DepthPolicy::price_choices(const CostModel& costs, const DraftCost& draft, int rows) {
  for (int r = 0; r < 2; ++r) {
    std::vector<Choice>& choices = choices_[static_cast<size_t>(r)];
    choices.clear();
    // A plain step leaves the regime as it is.
    choices.push_back({1.0, costs.row_cost(1, rows), r == 1 ? 1.0 : 0.0});
    double emitted = 1.0, reach = 1.0;
    for (int k = 1; k <= max_depth_; ++k) {
      reach *= estimate(static_cast<size_t>(k - 1), r);
      emitted += reach;
      choices.push_back({emitted, round_cost(costs, draft, rows, k), reach});
    }
  }
}

int DepthPolicy::best_rate_depth(int least) const {
  const std::vector<Choice>& now = choices_[static_cast<size_t>(run_)];
  // A depth of 0 (a plain step) must be beaten by kMinGain.
  int best = least;
  double best_rate = least == 0 ? kMinGain / now[0].seconds : 0.0;
  for (int k = std::max(1, least); k <= max_depth_; ++k) {
    const double rate = now[static_cast<size_t>(k)].emitted / now[static_cast<size_t>(k)].seconds;
    if (rate > best_rate) {
      best_rate = rate;
      best = k;
    }
  }
  return best;
}

int DepthPolicy::long_run_depth() const {
  // How deep, beyond that: a round accepted whole puts the next one in the after-a-full-accept
  // regime, a rejection in the other, and the two can pay very differently. The depth for the
  // current regime from the pair of depths (one per regime) with the best long-run rate. A
  // round's own rate cannot see where its full accept lands the next round: on a reply that
  // repeats a cycle of p tokens whose proposals hold for p - 1 and then break, a depth just
  // short of p - 1 is accepted whole every time and lands the next round on the broken token (a
  // wasted window, then a plain step), two rounds a cycle, while depth p - 1 or more lands it
  // on the next cycle's start, one round a cycle. The chain over both regimes sees that. Only
  // deeper: whether to draft at all stays with the round's own rate, as a pair's rate leans on
  // the other regime's estimates, which may be old.
  const std::array<std::vector<Choice>, 2>& choices = choices_;
  double best_rate = 0.0;
  int best = 0;
  for (int k0 = 0; k0 <= max_depth_; ++k0) {
    for (int k1 = 0; k1 <= max_depth_; ++k1) {
      const Choice& c0 = choices[0][static_cast<size_t>(k0)];
      const Choice& c1 = choices[1][static_cast<size_t>(k1)];
      // The share of rounds in regime 1 of a two-state chain that leaves 0 on a full accept
      // and 1 on a rejection; where neither is left, the current regime's share is all.
      const double leave0 = c0.full, leave1 = 1.0 - c1.full;
      const double share1 = leave0 + leave1 > 1e-9 ? leave0 / (leave0 + leave1) : (run_ == 1 ? 1.0 : 0.0);
      const double rate =
          ((1 - share1) * c0.emitted + share1 * c1.emitted) / ((1 - share1) * c0.seconds + share1 * c1.seconds);
      if (rate > best_rate) {
        best_rate = rate;
        best = run_ == 1 ? k1 : k0;
      }
    }
  }
  return best;
}

void DepthPolicy::observe(int drafted, int accepted) {
  if (drafted <= 0) return;  // a plain step: nothing learned, the regime stays
  // Positions tried: the accepted ones and the first rejected one, if any. The round counts for
  // its regime and for the pooled estimate.
  const int tried = std::min(drafted, accepted + 1);
  for (int r : {run_, 2}) {
    std::vector<double>& cond = cond_[r];
    std::vector<int>& seen = seen_[r];
    for (int i = 0; i < tried && i < static_cast<int>(cond.size()); ++i) {
      double& c = cond[static_cast<size_t>(i)];
      // A running mean with the prior as one observation, until it has been seen often enough
      // for the moving average: a request is only some 30 rounds long, and an average at rate
      // kAlphaRate would take most of them to move from its prior.
      int& n = seen[static_cast<size_t>(i)];
      const double rate = std::max(kAlphaRate, 1.0 / (n + 2));
      n = std::min(n + 1, 1000);
      c = std::clamp(c + rate * ((i < accepted ? 1.0 : 0.0) - c), 0.001, 0.999);
    }
    // Positions beyond the depth this round drafted drift back towards the prior: one early
    // rejection at position i would otherwise keep every later round shorter than i, and the
    // estimate that stops the policy from drafting there would never be tested again, even on a
    // row that accepts nearly every draft. Positions behind a rejection within the drafted depth
    // stay: the round did ask for them, and their low estimate is evidence, not staleness;
    // letting them drift would keep a row drafting a token that is never accepted.
    for (size_t i = static_cast<size_t>(std::max(drafted, 1)); i < cond.size(); ++i)
      if (cond[i] < kLaterPrior) cond[i] += kRelax * (kLaterPrior - cond[i]);
  }
  run_ = accepted >= drafted ? 1 : 0;
}

}  // namespace specdec
