// Two rules by which a block drafter's greedy row proposes another token than its argmax, and
// the score that decides, from verified rounds, whether a rule is followed.
//
// Rows that repeat their neighbour. A block drafter proposes all of its rows in one forward from
// nearly the same state, and a row whose argmax is also the row before it's is seldom what the
// target writes there: the rows collapse onto one likely token (`='` `='` `='` where the target
// writes `='` `skip` `ping`). Such a row proposes its runner-up instead.
//
// Rows the context continues. Where the request's text repeats itself (code that loops through
// the same arguments, an edit that copies its source), what followed the drafts' trailing tokens
// earlier in the text is often the target's next token while the drafter's later rows, which do
// not see the rows before them, have lost the thread. Such a row proposes the context's
// continuation instead.
//
// Verification shows the target's token at every row a round reaches whichever token was sent
// there, so the argmax and the alternative are both scored at each such row, with counts that
// fade: text on which the alternative stops being right turns the rule off, and back on when it
// is right again.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "speculative/draft.h"

namespace specdec {

class SwapScore {
 public:
  // `head_start`: the alternative's count before any outcome (the rule is followed until the
  // argmax has been right that much more often).
  explicit SwapScore(double head_start) : other_(head_start), seen_(head_start > 0 ? head_start : 0.0) {}
  // Whether a row that has an alternative proposes it.
  bool swap() const { return other_ >= own_; }
  // A row the round reached: whether the argmax, and whether the alternative, is the target's
  // token there.
  void observe(bool own_right, bool other_right);
  // How often the alternative has been right, over the faded outcomes (its head start counted as
  // that many right ones of as many outcomes, at most one).
  double other_rate() const;

 private:
  static constexpr double kKeep = 0.98;  // each outcome's weight fades by this per later outcome
  double own_ = 0.0, other_;
  double seen_;  // faded outcomes
};

// A greedy row's draft that had an alternative: the draft index, the drafter's own token and the
// alternative.
struct DraftSwap {
  int draft = 0;
  int32_t own = 0, other = 0;
};

// Scores a verified round's swaps and clears them: a swap's row was reached if every draft before
// it was accepted, and the target's token there is emitted[draft] (the accepted draft, or the
// target's own token after the last accepted one). Returns how many were scored and adds those on
// which each side was right.
int score_swaps(std::vector<DraftSwap>& swaps, const RowCommit& commit, SwapScore& score, int64_t& own_right,
                int64_t& other_right);

// The runner-up of a row of logits: the largest logit other than column `top`'s (the first of
// equal ones); -1 when there is none or it is NaN.
int32_t runner_up(std::span<const float> logits, int32_t top);

}  // namespace specdec
