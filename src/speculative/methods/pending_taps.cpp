// PendingTaps: tap-major storage ([taps][capacity][width] f32) in the backend's memory, so that
// each append is one contiguous device copy per tap and a consumer reads a tap's positions as
// one view. Grows by doubling; consumed positions are reclaimed when the next append needs room.
#include "speculative/methods/pending_taps.h"

#include <algorithm>

#include "core/error.h"

namespace specdec {

void PendingTaps::append(Backend& backend, const TargetContext& context) {
  if (context.empty()) return;
  const int taps = static_cast<int>(context.taps.size());
  const int64_t n = context.positions(), width = context.taps.front().dim(1);
  if (taps_ == 0) {
    taps_ = taps;
    width_ = width;
  }
  SPECDEC_CHECK(taps == taps_ && width == width_, "pending taps: ", taps, " taps of width ", width, " appended to ",
                taps_, " of width ", width_);
  for (const Tensor& t : context.taps)
    SPECDEC_CHECK(t.rank == 2 && t.dim(0) == n && t.dim(1) == width_ && t.dtype == DType::f32, "pending taps: tap ",
                  t.shape_string(), ", expected f32[", n, ", ", width_, "]");
  if (n == 0) return;
  reserve(backend, size() + n);
  for (int j = 0; j < taps_; ++j) backend.copy(context.taps[static_cast<size_t>(j)], tap_rows(j, end_, n));
  end_ += n;
}

Tensor PendingTaps::tap(int j, int64_t from, int64_t count) const {
  SPECDEC_CHECK(j >= 0 && j < taps_ && from >= 0 && count >= 0 && from + count <= size(), "pending taps: tap ", j,
                " positions [", from, ", ", from + count, ") outside ", taps_, " taps x ", size());
  return tap_rows(j, begin_ + from, count);
}

Tensor PendingTaps::storage() const {
  return buffer_.view(DType::f32, {std::max<int64_t>(1, int64_t{taps_} * capacity_), std::max<int64_t>(1, width_)});
}

Tensor PendingTaps::tap_rows(int j, int64_t at, int64_t count) const {
  return storage().rows(int64_t{j} * capacity_ + at, count);
}

void PendingTaps::consume(int64_t count) {
  SPECDEC_CHECK(count >= 0 && count <= size(), "pending taps: consuming ", count, " of ", size(), " positions");
  begin_ += count;
  if (begin_ == end_) begin_ = end_ = 0;
}

// Room for `positions` held positions. Consumed positions at the front make room without growing
// (moved through a new buffer: the copies may not overlap).
void PendingTaps::reserve(Backend& backend, int64_t positions) {
  if (begin_ + positions <= capacity_) return;
  move_to(backend, positions <= capacity_ ? capacity_ : std::max<int64_t>({positions, 2 * capacity_, 16}));
}

void PendingTaps::trim(Backend& backend, int64_t capacity) {
  if (capacity_ > capacity && size() <= capacity) move_to(backend, capacity);
}

// The old buffer may go before the copies out of it ran: a device backend frees memory in
// stream order, after the work queued on it.
void PendingTaps::move_to(Backend& backend, int64_t capacity) {
  const int64_t held = size();
  Buffer next = backend.allocate(static_cast<size_t>(int64_t{taps_} * capacity * width_) * sizeof(float));
  const Tensor to = next.view(DType::f32, {int64_t{taps_} * capacity, width_});
  for (int j = 0; j < taps_ && held > 0; ++j)
    backend.copy(tap_rows(j, begin_, held), to.rows(int64_t{j} * capacity, held));
  buffer_ = std::move(next);
  capacity_ = capacity;
  begin_ = 0;
  end_ = held;
}

std::vector<float> PendingTaps::read(Backend& backend) const {
  std::vector<float> host(static_cast<size_t>(int64_t{taps_} * size() * width_));
  for (int j = 0; j < taps_ && size() > 0; ++j)
    backend.copy(tap(j, 0, size()),
                 Tensor(host.data() + static_cast<size_t>(int64_t{j} * size() * width_), DType::f32, {size(), width_}));
  return host;
}

void PendingTaps::restore(Backend& backend, int taps, int64_t width, const std::vector<float>& host) {
  clear();
  if (host.empty()) return;
  SPECDEC_CHECK(taps > 0 && width > 0 && host.size() % static_cast<size_t>(int64_t{taps} * width) == 0,
                "pending taps: ", host.size(), " floats are no whole number of positions of ", taps, " taps x ", width);
  const int64_t n = static_cast<int64_t>(host.size()) / (int64_t{taps} * width);
  SPECDEC_CHECK(taps_ == 0 || (taps_ == taps && width_ == width), "pending taps: restoring ", taps, " x ", width,
                " into ", taps_, " x ", width_);
  taps_ = taps;
  width_ = width;
  reserve(backend, n);
  for (int j = 0; j < taps_; ++j)
    backend.copy(
        Tensor(const_cast<float*>(host.data()) + static_cast<size_t>(int64_t{j} * n * width), DType::f32, {n, width}),
        tap_rows(j, 0, n));
  end_ = n;
}

}  // namespace specdec
