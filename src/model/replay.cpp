// ReplayCache: when a shape runs call by call, when it is recorded, and the plan padding that
// lets consecutive decode steps share a recording.
#include "model/replay.h"

#include <algorithm>

#include "core/error.h"

namespace specdec {

ForwardPlan ReplayCache::padded(const ForwardPlan& plan) {
  ForwardPlan p = plan;
  const auto pow2 = [](int v) {
    int r = 1;
    while (r < v) r *= 2;
    return r;
  };
  p.max_row_len = pow2(std::max(plan.max_row_len, 256));
  p.max_blocks = pow2(std::max(plan.max_blocks, (p.max_row_len + plan.block_size - 1) / plan.block_size));
  p.block_table.assign(static_cast<size_t>(p.rows) * static_cast<size_t>(p.max_blocks), 0);
  for (int r = 0; r < p.rows; ++r)
    std::copy_n(plan.block_table.begin() + static_cast<ptrdiff_t>(r) * plan.max_blocks, plan.max_blocks,
                p.block_table.begin() + static_cast<ptrdiff_t>(r) * p.max_blocks);
  return p;
}

bool ReplayCache::replay_or_run(const ReplayKey& key, const std::function<void()>& calls) {
  if (recordings_.size() > kMaxRecordings && !recordings_.contains(key)) recordings_.clear();
  Replay& r = recordings_[key];
  if (r.recording && r.recording->replay()) return false;
  r.recording.reset();
  // The first step of a shape runs call by call: it creates whatever the backend makes lazily
  // (scratch, GEMM plans), which a recording must not do. Later steps record and replay. A
  // window shape (tokens > rows) records from its third run: a depth the policy tried once need
  // not pay for a recording, which costs about three forwards called one by one.
  const int eager_runs = key.tokens > key.rows ? 2 : 1;
  if (r.runs++ < eager_runs || r.unrecordable) {
    calls();
    return true;
  }
  try {
    r.recording = backend_.record(calls);
    // A backend that records nothing never will: later forwards skip the padding and the keys.
    if (!r.recording) backend_records_ = false;
  } catch (const Error&) {
    r.unrecordable = true;  // e.g. a buffer had to grow while recording: stay call by call
  }
  if (!r.recording || !r.recording->replay()) {
    r.recording.reset();
    r.unrecordable = true;
    calls();
  }
  return true;
}

}  // namespace specdec
