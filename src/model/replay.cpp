// ReplayCache: when a shape runs call by call, when it is recorded, and the plan padding that
// lets consecutive decode steps share a recording.
#include "model/replay.h"

#include <algorithm>

#include "core/error.h"

namespace specdec {

int ReplayCache::pow2(int v) {
  int r = 1;
  while (r < v) r *= 2;
  return r;
}

ReplayCache::Bounds ReplayCache::padded_bounds(int max_row_len, int max_blocks, int block_size) {
  Bounds b;
  b.max_row_len = pow2(std::max(max_row_len, 256));
  b.max_blocks = pow2(std::max(max_blocks, (b.max_row_len + block_size - 1) / block_size));
  return b;
}

ForwardPlan ReplayCache::padded(const ForwardPlan& plan) {
  ForwardPlan p = plan;
  const Bounds b = padded_bounds(plan.max_row_len, plan.max_blocks, plan.block_size);
  p.max_row_len = b.max_row_len;
  p.max_blocks = b.max_blocks;
  p.block_table.assign(static_cast<size_t>(p.rows) * static_cast<size_t>(p.max_blocks), 0);
  for (int r = 0; r < p.rows; ++r)
    std::copy_n(plan.block_table.begin() + static_cast<ptrdiff_t>(r) * plan.max_blocks, plan.max_blocks,
                p.block_table.begin() + static_cast<ptrdiff_t>(r) * p.max_blocks);
  return p;
}

int ReplayCache::window_width(int max_row_tokens) {
  return max_row_tokens > 16 ? max_row_tokens : pow2(max_row_tokens);  // past the tile kernels' 16: as it is
}

bool ReplayCache::batch_windows(const ForwardPlan& plan) {
  if (plan.outputs != plan.tokens || plan.tokens == plan.rows) return false;
  // The padding's tokens go through every linear and the LM head. Up to kMaxPaddedWindowTokens
  // tokens a GPU's linears are bound by reading the weights (a token adds one multiply-add per
  // weight read, well under what the tensor cores do in that time), so they cost about nothing;
  // past it they would cost arithmetic in a forward long enough that its launches matter less.
  if (plan.rows * window_width(plan.max_row_tokens) > kMaxPaddedWindowTokens) return false;
  for (int r = 0; r < plan.rows; ++r) {
    const int n = plan.row_starts[r + 1] - plan.row_starts[r];
    const int taps = plan.tap_offsets.empty() ? 0 : plan.tap_offsets[r + 1] - plan.tap_offsets[r];
    if (taps != 0 && taps != n) return false;
  }
  return true;
}

ForwardPlan ReplayCache::padded_windows(const ForwardPlan& plan) {
  const int R = plan.rows, width = window_width(plan.max_row_tokens);
  ForwardPlan p = plan;
  p.tokens = R * width;
  p.max_row_tokens = width;
  p.ids.assign(static_cast<size_t>(p.tokens), 0);
  p.positions.assign(static_cast<size_t>(p.tokens), 0);
  p.slots.assign(static_cast<size_t>(p.tokens), -1);
  std::vector<int32_t> moved(static_cast<size_t>(plan.tokens));  // given token index -> padded one
  for (int r = 0; r < R; ++r) {
    const int from = plan.row_starts[r], n = plan.row_starts[r + 1] - from, to = r * width;
    p.row_starts[r] = to;
    for (int j = 0; j < width; ++j) {
      const size_t src = static_cast<size_t>(from + std::min(j, n - 1)), dst = static_cast<size_t>(to + j);
      p.ids[dst] = plan.ids[src];
      p.positions[dst] = plan.positions[src];
      if (j < n) {
        p.slots[dst] = plan.slots[src];
        moved[src] = static_cast<int32_t>(dst);
      }
    }
  }
  p.row_starts[R] = p.tokens;
  // The given outputs and taps first, where the given plan had them; then the padding's.
  const auto pad_list = [&](const std::vector<int32_t>& given, bool tapped_rows_only) {
    std::vector<int32_t> out;
    out.reserve(static_cast<size_t>(p.tokens));
    for (int32_t t : given) out.push_back(moved[static_cast<size_t>(t)]);
    for (int r = 0; r < R; ++r) {
      const int n = plan.row_starts[r + 1] - plan.row_starts[r];
      if (tapped_rows_only && plan.tap_offsets[r + 1] == plan.tap_offsets[r]) continue;
      for (int j = n; j < width; ++j) out.push_back(r * width + j);
    }
    return out;
  };
  p.out_index = pad_list(plan.out_index, false);
  p.outputs = static_cast<int>(p.out_index.size());
  if (plan.taps > 0) {
    p.tap_index = pad_list(plan.tap_index, true);
    p.taps = static_cast<int>(p.tap_index.size());
  }
  return p;
}

bool ReplayCache::replay_or_run(const ReplayKey& key, const std::function<void()>& calls) {
  if (recordings_.size() >= kMaxRecordings && !recordings_.contains(key)) {
    auto oldest = recordings_.begin();
    for (auto it = recordings_.begin(); it != recordings_.end(); ++it)
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    recordings_.erase(oldest);
  }
  Replay& r = recordings_[key];
  r.last_use = ++uses_;
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
    if (r.recording) recorded_ = true;
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
