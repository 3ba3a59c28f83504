// The DSpark confidence cut: from the calibrated chance that each block row is accepted given
// the rows before it, the number of drafts worth sending to verification this round, weighed
// against what each width of verify window costs. A block drafter proposes every row of its
// block in one forward, so the drafts are already paid for: the cut only decides how wide the
// target's window is, and a wider window pays only while the expected extra tokens outweigh its
// extra price.
#pragma once

#include <span>
#include <vector>

#include "speculative/methods/dflash_format.h"

namespace specdec {

// P(row k accepted | rows 1..k-1 accepted) for block row k (1-based) with raw head score `score`
// and the log of the drafter's top probability there.
double dspark_row_probability(const DsparkHead& head, int row, double score, double log_max_q);
// The same before its sigmoid: the calibration's logit.
double dspark_row_logit(const DsparkHead& head, int row, double score, double log_max_q);

// The shipped calibration, corrected online for the text being served. It was fitted on the
// training text with the drafter's context complete, and a deployment's text (and the gaps a
// paused row leaves in the context) can move every row's acceptance; where it underestimates the
// later rows the cut sends too few drafts, and those are never verified to show otherwise. Each
// block row keeps an offset to its logit, moved by every verified row's outcome (log-loss
// gradient steps: the offset settles where the corrected chances average the observed rate);
// a row verified too seldom to tell borrows the offset of the row before it, since a bias in one
// row's calibration comes with the same bias in the next. A drafter keeps one for all of its
// requests and one per request on top of it: how predictable the text is differs from request to
// request (code copied from the prompt against new prose), and an engine-wide correction alone
// would cut a predictable request's blocks at the average's length.
class CutCalibration {
 public:
  // `rate`: the gradient step per outcome (an engine-wide correction moves slowly; one request's
  // own deviation from it must move within the request's few dozen rounds).
  explicit CutCalibration(double rate = 0.05) : rate_(rate) {}
  // The corrected P(row accepted | rows before it accepted), from the calibration's logit.
  double probability(int row, double logit) const;
  // A verified block row: `logit` as the calibration gave it, and whether it was accepted (a
  // round's accepted rows and its first rejected one; rows after that were never tried).
  void observe(int row, double logit, bool accepted);
  // The offset block row `row` (1-based) adds to the calibration's logit.
  double offset(int row) const;

 private:
  double rate_;
  std::vector<double> offset_;  // per block row, 0-based
  std::vector<int> seen_;       // verified outcomes per block row (capped)
};

// The number of drafts (0..survival.size()) that maximises expected tokens per second of the
// round: (1 + sum of survival[0..k)) / (draft_seconds + window_seconds[k]), where survival[j] is
// the chance that drafts 0..j are all accepted and window_seconds[k] the price of a window of
// k + 1 tokens. Without usable prices (fewer than survival.size() + 1, or not positive) the
// drafts are all kept: the depth policy's choice stands.
int dspark_cut(std::span<const double> survival, std::span<const double> window_seconds, double draft_seconds);

}  // namespace specdec
