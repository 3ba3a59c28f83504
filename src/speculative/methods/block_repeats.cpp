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

int score_swaps(std::vector<DraftSwap>& swaps, const RowCommit& commit, SwapScore& score, int64_t& own_right,
                int64_t& other_right) {
  int scored = 0;
  for (const DraftSwap& e : swaps)
    if (e.draft <= commit.accepted && e.draft < static_cast<int>(commit.emitted.size())) {
      const int32_t t = commit.emitted[static_cast<size_t>(e.draft)];
      score.observe(t == e.own, t == e.other);
      own_right += t == e.own ? 1 : 0;
      other_right += t == e.other ? 1 : 0;
      ++scored;
    }
  swaps.clear();
  return scored;
}

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
