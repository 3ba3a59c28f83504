// Drafts the request's own text continues. Where the text repeats itself (code that loops through
// the same arguments, an edit that copies its source, a quote), what followed the drafts'
// trailing tokens earlier in the text is often the target's next token where a block drafter's
// later rows, which do not see the rows before them, have lost the thread. A greedy row's drafts
// are checked against that continuation one by one; where they differ, the continuation is
// proposed instead while it has been right at least as often as the drafter (SwapScore, scored
// per request at every such row a verified round reaches, since it is the request's text that
// repeats itself or not). A chain drafter sees its own drafts and follows such text by itself:
// checked the same way, its rounds got shorter.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "speculative/draft.h"
#include "speculative/methods/block_repeats.h"
#include "speculative/methods/ngram.h"

namespace specdec {

// A greedy row's draft that had an alternative: the draft index, the drafter's own token and the
// alternative.
struct DraftSwap {
  int draft = 0;
  int32_t own = 0, other = 0;
};

// Scores a verified round's swaps and clears them: a swap's row was reached if every draft before
// it was accepted, and the target's token there is emitted[draft] (the accepted draft, or the
// target's own token after the last accepted one). Returns how many were scored and adds those on
// which each side was right.
int score_swaps(std::vector<DraftSwap>& swaps, const RowCommit& commit, SwapScore& score, int64_t& own_right,
                int64_t& other_right);

// Telemetry of a method's lookups (summed over its rows).
struct LookupStats {
  int64_t looked_up = 0;                     // drafts proposed from the context instead of the drafter's own token
  int64_t scored = 0;                        // rows with both a drafter's token and the context's that a round reached
  int64_t own_right = 0, context_right = 0;  // of them, where each was the target's token
};

// One row's lookup. Between begin() and end() its index holds the row's tokens, the pending one
// and the drafts taken so far; the known tokens only grow, so each begin() appends only the new
// ones.
class ContextLookup {
 public:
  ContextLookup();

  void begin(std::span<const int32_t> known, int32_t pending);
  // Draft `draft`, whose drafter's token is `own`: the token to propose (the context's where it
  // differs and the rule is followed), taken into the index.
  int32_t choose(int draft, int32_t own, LookupStats& stats);
  void end();

  // How often the context's continuation has been right where it differed from the drafter, on
  // this request so far.
  double rate() const { return score_.other_rate(); }
  // Whether the last choose()'s continuation was the drafter's own token.
  bool agreed() const { return agreed_; }

  // A verified round: scores its swaps.
  void commit(const RowCommit& c, LookupStats& stats);

 private:
  NgramIndex index_;
  SwapScore score_;
  std::vector<DraftSwap> swaps_;
  bool agreed_ = false;
  size_t known_ = 0;  // the index's first known_ tokens are the row's known ones
};

}  // namespace specdec
