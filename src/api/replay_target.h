// The target's side of a replay: forwards of a verify window's widths timed at a fixed context,
// and prompt prefills, each on a scratch KV cache of its own (no request's cache is touched).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"

namespace specdec {

double median_of(std::vector<double> v);

// Median seconds of fn() over `reps` calls.
template <typename Fn>
double median_seconds(int reps, Fn&& fn) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median_of(std::move(t));
}

// A scratch sequence holding a context, with room for more tokens past it.
struct Scratch {
  std::unique_ptr<KvCache> cache;
  KvCache::SeqId seq = 0;
  int context = 0;
};

// `context` fed in one forward, `room` tokens of space after it.
Scratch scratch(Model& model, const std::vector<int32_t>& context, int room);
// One forward of `width` tokens at the scratch sequence's end, greedy tokens drawn on the
// backend at every position (as a verify window draws them), then rolled back.
void window(Model& model, Scratch& sc, int width);
// [w]: seconds of a window of w tokens, w = 1 .. widths ([0] unused). Each width's median over
// a block of calls (a width follows itself, as a plain step does in decoding), then the median
// over three passes, so that a drifting machine does not tilt one width against the others.
std::vector<double> time_windows(Model& model, Scratch& sc, int widths, int reps);

}  // namespace specdec
