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

// The number of drafts (0..survival.size()) that maximises expected tokens per second of the
// round: (1 + sum of survival[0..k)) / (draft_seconds + window_seconds[k]), where survival[j] is
// the chance that drafts 0..j are all accepted and window_seconds[k] the price of a window of
// k + 1 tokens. Without usable prices (fewer than survival.size() + 1, or not positive) the
// drafts are all kept: the depth policy's choice stands.
int dspark_cut(std::span<const double> survival, std::span<const double> window_seconds, double draft_seconds);

}  // namespace specdec
