#include "speculative/methods/context_lookup.h"

#include <algorithm>

namespace specdec {

namespace {

// The longest of the trailing 3..12 tokens found earlier in the text gives what followed its latest
// occurrence (one or two tokens recur too often to say much: on free text their continuations
// were wrong where the drafter was right). Long matches place a row within a repeated line; the
// latest occurrence is the text as it goes now, where the first is often an irregular first line.
constexpr int kMaxNgram = 12, kMinNgram = 3;
// Rows start following the context, half an outcome ahead: one row on which the drafter was right
// and the context wrong turns them back to the drafter's own tokens.
constexpr double kHeadStart = 0.5;

}  // namespace

ContextLookup::ContextLookup() : index_(kMaxNgram, kMinNgram, Occurrence::latest), score_(kHeadStart) {}

void ContextLookup::begin(std::span<const int32_t> known, int32_t pending) {
  swaps_.clear();
  // Past `known_` the index may hold a call's drafts that end() did not take back (a call that
  // failed half way).
  index_.truncate(std::min(known_, known.size()));
  index_.append(known.subspan(index_.size()));
  known_ = known.size();
  index_.append(std::span<const int32_t>(&pending, 1));
}

ContextLookup::Choice ContextLookup::choose(int draft, int32_t own, LookupStats& stats) {
  Choice c{own, false};
  const std::vector<int32_t> next = index_.propose(1);
  if (!next.empty()) {
    c.agreed = next.front() == own;
    if (!c.agreed) {
      swaps_.push_back({draft, own, next.front()});
      if (score_.swap()) {
        c.token = next.front();
        stats.looked_up += 1;
      }
    }
  }
  index_.append(std::span<const int32_t>(&c.token, 1));
  return c;
}

int32_t ContextLookup::extend(LookupStats& stats) {
  if (!score_.swap()) return -1;
  const std::vector<int32_t> next = index_.propose(1);
  if (next.empty()) return -1;
  index_.append(next);
  stats.extended += 1;
  return next.front();
}

void ContextLookup::end() { index_.truncate(known_); }

void ContextLookup::commit(const RowCommit& c, LookupStats& stats) {
  stats.scored += score_swaps(swaps_, c, score_, stats.own_right, stats.context_right);
}

}  // namespace specdec
