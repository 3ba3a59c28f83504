// Block rows that repeat their neighbour. A block drafter proposes all of its rows in one
// forward from nearly the same state, and a row whose argmax is also the row before it's is
// seldom what the target writes there: the rows collapse onto one likely token (`='` `='` `='`
// where the target writes `='` `skip` `ping`). Where a greedy row repeats, the drafter proposes
// that row's runner-up instead, while the runner-up has been right at least as often as the
// repeat. Both are scored at every repeating row a round reaches, since verification shows the
// target's token there whichever of the two was sent; the counts fade, so text that does repeat
// its tokens turns the swap off.
#pragma once

#include <cstdint>
#include <span>

namespace specdec {

class RepeatChoice {
 public:
  // Whether a repeating row proposes its runner-up.
  bool runner_up() const { return runner_ >= repeat_; }
  // A repeating row the round reached: whether the repeat, and whether the runner-up, is the
  // target's token there.
  void observe(bool repeat_right, bool runner_right);

 private:
  static constexpr double kKeep = 0.98;  // each outcome's weight fades by this per later outcome
  // Faded counts of each being right; the runner-up starts ahead by half an outcome.
  double repeat_ = 0.0, runner_ = 0.5;
};

// The runner-up of a row of logits: the largest logit other than column `top`'s (the first of
// equal ones); -1 when there is none or it is NaN.
int32_t runner_up(std::span<const float> logits, int32_t top);

}  // namespace specdec
