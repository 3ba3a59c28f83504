// Drafts the request's own text continues. Where the text repeats itself (code that loops through
// the same arguments, an edit that copies its source, a quote), what followed the drafts'
// trailing tokens earlier in the text is often the target's next token where a block drafter's
// later rows, which do not see the rows before them, have lost the thread. An exact-mode row's drafts
// are checked against that continuation one by one; where they differ, the continuation is
// proposed instead while it has been right at least as often as the drafter (SwapScore, scored
// per request at every such row a verified round reaches, since it is the request's text that
// repeats itself or not). A chain drafter sees its own drafts and follows such text by itself,
// but for what a few lines back cannot tell (which repeat of a line it is in): its chain takes
// the text's token where it first leaves the text, and the text's continuation after it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "speculative/draft.h"
#include "speculative/methods/block_repeats.h"
#include "speculative/methods/ngram.h"

namespace specdec {

// The widest verify window a hidden-state drafter's round fills with its own drafts and then the
// text's continuation of them.
inline constexpr int kLookupWindow = 16;

// Telemetry of a method's lookups (summed over its rows).
struct LookupStats {
  int64_t looked_up = 0;                     // drafts proposed from the context instead of the drafter's own token
  int64_t scored = 0;                        // rows with both a drafter's token and the context's that a round reached
  int64_t own_right = 0, context_right = 0;  // of them, where each was the target's token
  int64_t extended = 0;                      // drafts past the drafter's own, from the context alone
};

// One row's lookup. Between begin() and end() its index holds the row's tokens, the pending one
// and the drafts taken so far; the known tokens only grow, so each begin() appends only the new
// ones.
class ContextLookup {
 public:
  ContextLookup();

  void begin(std::span<const int32_t> known, int32_t pending);
  // Draft `draft`, whose drafter's token is `own`: the token to propose (the context's where it
  // differs and the rule is followed), taken into the index, and whether the context's
  // continuation was `own` itself.
  struct Choice {
    int32_t token = 0;
    bool agreed = false;
  };
  Choice choose(int draft, int32_t own, LookupStats& stats);
  // Past the drafter's last row: the text's continuation of the drafts so far, taken into the
  // index; -1 where the text has none, or where its continuations have lately been wrong more
  // often than the drafter's own tokens (the same rule as choose()'s).
  int32_t extend(LookupStats& stats);
  void end();

  // How often the context's continuation has been right where it differed from the drafter, on
  // this request so far.
  double rate() const { return score_.other_rate(); }

  // A verified round: scores its swaps.
  void commit(const RowCommit& c, LookupStats& stats);

 private:
  NgramIndex index_;
  SwapScore score_;
  std::vector<DraftSwap> swaps_;
  size_t known_ = 0;  // the index's first known_ tokens are the row's known ones
};

}  // namespace specdec
