// The draft method's side of a replay, driven only through the draft seam as the engine drives
// it: a one-row group prefilled with a prompt, then a round per generated token (draft after the
// pending token, commit the target's token), recording how far each proposal matched; and the
// cost of draft calls timed the same way.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "api/replay_target.h"
#include "model/model.h"
#include "sampling/sampling.h"
#include "speculative/draft.h"
#include "speculative/replay.h"

namespace specdec {

// One row of a method's group, sampling as `sampling` says (its drafts drawn with the target's
// keys, as an exact-mode row's are), at its own absolute positions.
class SeamRow {
 public:
  SeamRow(DraftMethod& method, const Model& target, const SamplingParams& sampling);
  // Prompt tokens the target has processed.
  void prefill(std::span<const int32_t> tokens);
  // Up to `depth` drafts after `pending` (the last token, not yet processed).
  DraftProposal draft(int32_t pending, int depth);
  // The round's outcome: none of its `drafted` drafts accepted, the target's token `next` follows
  // `pending`; the row moves on by one token.
  void commit(int32_t pending, int drafted, int32_t next);

 private:
  std::unique_ptr<DraftRows> rows_;
  int64_t position_ = 0;  // absolute position of the next pending token
  SamplingParams sampling_;
};

// Drafts a method proposes along a request decoded with `sampling`, round by round through the
// seam: run[t] is how many of the drafts offered after generated[t - 1] equal generated[t],
// [t + 1], ...
ReplayTrace seam_trace(DraftMethod& method, const Model& target, const std::vector<int32_t>& prompt,
                       const std::vector<int32_t>& generated, int depth, const SamplingParams& sampling);

struct DraftCallCosts {
  double fixed = 0;  // a call of depth k costs fixed + step * k seconds
  double step = 0;
  std::vector<double> window_after_call;  // [w]: a target window of w tokens right after a call of depth w - 1
};

// Draft calls right after a target forward (as in a round), and target windows right after a
// draft call (its steps take some of the target's weights out of the caches).
DraftCallCosts time_draft_calls(DraftMethod& method, Model& target, Scratch& target_scratch,
                                const std::vector<int32_t>& context, int widths, int reps,
                                const SamplingParams& sampling);
// The method's prefill of a prompt, on a fresh row.
double time_draft_prefill(DraftMethod& method, const Model& target, const std::vector<int32_t>& prompt, int reps);

}  // namespace specdec
