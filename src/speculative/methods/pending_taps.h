// A row's target taps of accepted positions that its drafter has not consumed yet, kept in the
// backend's memory. A hidden-state drafter takes the taps every round (they die with the next
// target forward) but does its own work on them only in a round in which the row drafts: until
// then keeping them costs one device copy per tap and round, and no host synchronization.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "speculative/draft.h"

namespace specdec {

class PendingTaps {
 public:
  // Appends the context's positions after the ones held (device copies, queued on `backend`).
  // Every tap of every call must have the same count and width.
  void append(Backend& backend, const TargetContext& context);
  // Positions held, oldest first.
  int64_t size() const { return end_ - begin_; }
  bool empty() const { return end_ == begin_; }
  int taps() const { return taps_; }
  int64_t width() const { return width_; }
  // Positions [from, from + count) of tap j, as an f32 [count, width] view in the backend's
  // memory; valid until the next append or restore.
  Tensor tap(int j, int64_t from, int64_t count) const;
  // The view of tap j's storage as [taps * capacity, width], with the row of (tap j, held
  // position p) at row_of(j, p): for one gather of several taps' rows.
  Tensor storage() const;
  int64_t row_of(int j, int64_t p) const { return int64_t{j} * capacity_ + begin_ + p; }
  // Forgets the oldest `count` positions (the drafter consumed them).
  void consume(int64_t count);
  void clear() { begin_ = end_ = 0; }
  // Gives back the memory past `capacity` positions while no more are held (after a long
  // prompt went through).
  void trim(Backend& backend, int64_t capacity);

  // The held positions on the host, tap-major ([taps][size][width]), for a checkpoint.
  std::vector<float> read(Backend& backend) const;
  // Replaces the held positions by a read() of `taps` taps of `width`.
  void restore(Backend& backend, int taps, int64_t width, const std::vector<float>& host);

 private:
  void reserve(Backend& backend, int64_t positions);
  void move_to(Backend& backend, int64_t capacity);         // the held positions to the front of a new buffer
  Tensor tap_rows(int j, int64_t at, int64_t count) const;  // storage rows, not held positions

  Buffer buffer_;
  int taps_ = 0;
  int64_t width_ = 0;
  int64_t capacity_ = 0;  // positions per tap in buffer_
  int64_t begin_ = 0, end_ = 0;
};

}  // namespace specdec
