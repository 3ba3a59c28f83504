// ReplayCache: decode steps (and verify windows) of one shape repeat the same backend
// calls on the same buffers, so they are recorded once per shape and replayed from then on.
// The key says what makes two forwards the same recording; the plan padding makes consecutive
// decode steps share one.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/model_batch.h"

namespace specdec {

// What a forward returns per output row: its logits, or its token, taken by Backend::argmax when
// every row is greedy and by Backend::sample otherwise.
enum class Selection : uint8_t { logits, argmax, sample };

struct ReplayKey {
  int rows = 0, tokens = 0, max_row_tokens = 0, max_blocks = 0, max_row_len = 0;
  Selection selection = Selection::logits;
  // The hidden taps: which layers, and how many tapped rows (which rows they are is metadata,
  // uploaded before each replay like the token ids).
  std::vector<int> tap_layers;
  int taps = 0;
  // The cache a recording writes into, by its memory: every pool's address and the pool size
  // (a later cache may reuse an earlier one's addresses, but then it is the same memory).
  int pool_blocks = 0;
  std::vector<const void*> pools;
  // Rows the forward returns (through the LM head).
  int outputs = 0;
  // Recorded while Backend::allow_fast_kernels held (other kernels than the same shape's without).
  bool fast_kernels = false;
  // The forward also scored its returned rows (a block drafter's confidences for its cut).
  bool scores = false;
  auto operator<=>(const ReplayKey&) const = default;
};

class ReplayCache {
 public:
  explicit ReplayCache(Backend& backend) : backend_(backend) {}

  // False once the backend has shown it records nothing: callers then skip padding and keys.
  bool available() const { return backend_records_; }
  // True once the backend has made a recording.
  bool recorded() const { return recorded_; }
  // A decode step's plan with its shape rounded up (block-table width, attention length bound),
  // so that consecutive steps share one recording: the kernels read the true lengths from the
  // metadata, and the larger bounds only size grids whose surplus blocks do nothing.
  static ForwardPlan padded(const ForwardPlan& plan);
  // The bounds padded() gives a plan: the longest row rounded up to a power of two (at least
  // 256), the block-table width to a power of two that covers it. Other forwards over a paged
  // cache (a drafter's) pad theirs the same way.
  struct Bounds {
    int max_row_len = 0, max_blocks = 0;
  };
  static Bounds padded_bounds(int max_row_len, int max_blocks, int block_size);
  // The smallest power of two at least v (1 for v <= 1).
  static int pow2(int v);
  // True for a batch of verify windows that padded_windows lays out: one row or several, every
  // token returning its row, some row more than one token, each row tapped at all of its tokens
  // or at none, and no more than kMaxPaddedWindowTokens tokens once padded.
  static bool batch_windows(const ForwardPlan& plan);
  static constexpr int kMaxPaddedWindowTokens = 128;
  // The width a batch's windows are padded to: the longest rounded up to a power of two, up to
  // 16 (the tile attention's most tokens a row); a longer one as it is.
  static int window_width(int max_row_tokens);
  // A batch of verify windows with every row's window padded to one width (the longest, rounded
  // up to a power of two up to 16), so that a batch's windows come in a few recorded shapes
  // instead of one per combination of depths, and one row's in a few instead of one per depth:
  // every shape runs call by call and records once, and a depth the policy picks for the first
  // time late in a request would pay that inside it. A padding token repeats its row's last real
  // token at that token's position, writes no K/V (slot -1) and attends as that token does; its
  // returned row and tap come after every real one, so the first outputs and taps of the padded
  // plan are the given plan's, in its order (its row_offsets and tap_offsets still hold).
  static ForwardPlan padded_windows(const ForwardPlan& plan);
  // Replays the recording for `key`, or runs `calls` (recording them from their second run on,
  // or third for a window shape). True when it did not replay: the forward paid one-off costs.
  bool replay_or_run(const ReplayKey& key, const std::function<void()>& calls);
  // Forgets every recording (they point into buffers that moved).
  void clear() { recordings_.clear(); }
  // Shapes held (recorded or counting their runs towards a recording).
  size_t size() const { return recordings_.size(); }
  // Decode steps take a few shapes per batch size, a row's verify windows one per width, a
  // batch's windows one per (rows, padded width): past this many shapes the one used longest ago
  // is dropped, so that a server whose batch size wanders keeps the shapes it runs now.
  static constexpr size_t kMaxRecordings = 256;

 private:
  struct Replay {
    std::unique_ptr<RecordedCalls> recording;
    int runs = 0;
    bool unrecordable = false;
    uint64_t last_use = 0;
  };

  Backend& backend_;
  std::map<ReplayKey, Replay> recordings_;
  uint64_t uses_ = 0;            // replay_or_run calls so far: the clock of Replay::last_use
  bool backend_records_ = true;  // until Backend::record returns nothing
  bool recorded_ = false;        // since Backend::record first returned a recording
};

}  // namespace specdec
