// The DSpark confidence cut (see dspark.h).
#include "speculative/methods/dspark.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace specdec {

namespace {
constexpr double kMaxOffset = 4.0;         // logit units: an offset never overrules the score entirely
constexpr int kOwnEvidence = 20;           // outcomes after which a row's offset is its own alone

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }
}  // namespace

double dspark_row_logit(const DsparkHead& head, int row, double score, double log_max_q) {
  SPECDEC_CHECK(row >= 1 && row <= static_cast<int>(head.calibration.size()), "DSpark: block row ", row,
                " has no calibration (", head.calibration.size(), " rows calibrated)");
  const auto& c = head.calibration[static_cast<size_t>(row - 1)];
  return c[0] * score + c[1] * log_max_q + c[2];
}

double dspark_row_probability(const DsparkHead& head, int row, double score, double log_max_q) {
  return sigmoid(dspark_row_logit(head, row, score, log_max_q));
}

double CutCalibration::offset(int row) const {
  double borrowed = 0.0;
  for (int r = 1; r <= row; ++r) {
    const auto i = static_cast<size_t>(r - 1);
    if (i >= offset_.size()) break;  // rows never verified keep the last borrowed offset
    const double w = std::min(1.0, static_cast<double>(seen_[i]) / kOwnEvidence);
    borrowed = w * offset_[i] + (1 - w) * borrowed;
  }
  return borrowed;
}

double CutCalibration::probability(int row, double logit) const { return sigmoid(logit + offset(row)); }

void CutCalibration::observe(int row, double logit, bool accepted) {
  if (row < 1) return;
  const auto i = static_cast<size_t>(row - 1);
  if (i >= offset_.size()) {
    offset_.resize(i + 1, 0.0);
    seen_.resize(i + 1, 0);
  }
  // A row's first own outcomes start from what it borrowed, so that taking over is smooth.
  if (seen_[i] == 0) offset_[i] = offset(row);
  const double p = sigmoid(logit + offset_[i]);
  offset_[i] = std::clamp(offset_[i] + rate_ * ((accepted ? 1.0 : 0.0) - p), -kMaxOffset, kMaxOffset);
  seen_[i] = std::min(seen_[i] + 1, 1 << 20);
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
