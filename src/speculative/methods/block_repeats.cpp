#include "speculative/methods/block_repeats.h"

#include <algorithm>
#include <cmath>

namespace specdec {

void SwapScore::observe(bool own_right, bool other_right) {
  own_ = own_ * kKeep + (own_right ? 1.0 : 0.0);
  other_ = other_ * kKeep + (other_right ? 1.0 : 0.0);
  seen_ = seen_ * kKeep + 1.0;
}

double SwapScore::other_rate() const { return seen_ > 0 ? std::clamp(other_ / seen_, 0.0, 1.0) : 0.0; }

int32_t runner_up(std::span<const float> logits, int32_t top) {
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (static_cast<int32_t>(i) == top) continue;
    if (best < 0 || logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  if (best >= 0 && std::isnan(logits[static_cast<size_t>(best)])) return -1;
  return best;
}

}  // namespace specdec
