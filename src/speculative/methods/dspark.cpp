// The DSpark confidence cut (see dspark.h).
#include "speculative/methods/dspark.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace specdec {

double dspark_row_probability(const DsparkHead& head, int row, double score, double log_max_q) {
  SPECDEC_CHECK(row >= 1 && row <= static_cast<int>(head.calibration.size()), "DSpark: block row ", row,
                " has no calibration (", head.calibration.size(), " rows calibrated)");
  const auto& c = head.calibration[static_cast<size_t>(row - 1)];
  const double z = c[0] * score + c[1] * log_max_q + c[2];
  return 1.0 / (1.0 + std::exp(-z));
}

int dspark_cut(std::span<const double> survival, std::span<const double> window_seconds, double draft_seconds) {
  const int n = static_cast<int>(survival.size());
  if (static_cast<int>(window_seconds.size()) < n + 1) return n;
  for (int k = 0; k <= n; ++k)
    if (!(window_seconds[static_cast<size_t>(k)] > 0)) return n;
  double expected = 1.0, best_rate = -1.0;
  int best = 0;
  for (int k = 0; k <= n; ++k) {
    if (k > 0) expected += survival[static_cast<size_t>(k - 1)];
    const double rate = expected / (std::max(0.0, draft_seconds) + window_seconds[static_cast<size_t>(k)]);
    // Ties go to the shorter window: the same rate for less target work.
    if (rate > best_rate * (1 + 1e-12)) {
      best_rate = rate;
      best = k;
    }
  }
  return best;
}

}  // namespace specdec
