// The scheduler: which rows run this iteration and with how many tokens. Waiting requests are
// admitted first come, first served while rows and KV blocks allow; decoding rows (a step, or a
// verify window of their drafts) go first, oldest first, and prefill chunks fill what is left of
// the token budget. KV is the admission currency: a row that cannot reserve its tokens preempts
// the youngest rows (they re-prefill later), and only the oldest row, alone and still short, fails.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "engine/row.h"
#include "kv/kv_cache.h"
#include "speculative/coordinator.h"

namespace specdec {

// A row's part of this iteration's forward.
struct ScheduledRow {
  Row* row = nullptr;
  bool decode = false;  // pending + the row's proposal; otherwise a prefill chunk
  int chunk = 0;        // prefill tokens
};

struct SchedulerOptions {
  int max_rows = 64;          // rows decoding or prefilling at once
  int max_batch_tokens = 512; // tokens in one forward
  bool prefix_cache = true;   // a new row shares the cached KV blocks of its prompt's prefix
};

class Scheduler {
 public:
  Scheduler(KvCache& kv, Coordinator& coordinator, SchedulerOptions options);

  void add(std::unique_ptr<Row> row);
  // Ends the request wherever it is; it leaves with the next remove_finished().
  void cancel(int64_t id);
  // Admits waiting rows while the row limit and the KV (the target's and the row's draft
  // method's) allow; a row larger than what is free waits for running rows to finish. A row
  // starts past the prefix of its prompt that the KV cache already holds (its method learns
  // those tokens as a prefill block), unless its method needs the target's taps of them.
  // plain_only: admission stops at the first waiting row that speculates; returns whether it
  // stopped there (that row would have been admitted otherwise).
  bool admit(bool plain_only = false);
  // Plans the forward and reserves its KV. Rows preempted on the way go back to the waiting
  // queue; a row that can never fit ends with an error.
  std::vector<ScheduledRow> schedule();
  // Takes out the rows that have finished, their KV and draft state released.
  std::vector<std::unique_ptr<Row>> remove_finished();

  const std::vector<std::unique_ptr<Row>>& running() const { return running_; }
  int decoding() const;
  bool idle() const { return running_.empty() && waiting_.empty(); }
  int waiting() const { return static_cast<int>(waiting_.size()); }
  int64_t preemptions() const { return preemptions_; }

 private:
  // Reserves KV for the row to reach `length`, preempting younger rows; when even that fails
  // the oldest row ends with an error and any other row yields (is preempted). Returns whether
  // the row runs this iteration.
  bool reserve(Row& row, int length, const char* what);
  void preempt(Row& row);
  void share_cached_prefix(Row& row);

  KvCache& kv_;
  Coordinator& coordinator_;
  SchedulerOptions options_;
  std::vector<std::unique_ptr<Row>> running_;  // oldest first
  std::deque<std::unique_ptr<Row>> waiting_;
  int64_t preemptions_ = 0;
};

}  // namespace specdec
