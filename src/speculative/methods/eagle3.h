// The EAGLE-3 method: a one-layer head reads three of the target's hidden-state taps (fused by
// its fc), the target's embedding of the next token and its own KV, and chains k drafts a round,
// each step feeding its own output hidden back in place of the target's. After a round the
// verified positions' real taps replace those guesses (its KV is cut back to them). Drafts are
// coupled draws over the target vocabulary (zero outside the head's draft vocabulary), so exact
// mode matches the target at any temperature; q is supplied for rejection mode.
#pragma once

#include <memory>
#include <string>

#include "speculative/draft.h"
#include "speculative/methods/context_lookup.h"
#include "speculative/methods/eagle3_head.h"

namespace specdec {

// The most drafts the head chains in a round. As the draft model's cap: on text the head predicts
// well (a repeated block, with the context rows a repeated rare name) rounds accept whole, and a
// shallower cap would end them early.
inline constexpr int kEagle3Chain = 8;

struct Eagle3Options {
  // The most drafts a round asks for (0: the most there can be); the depth policy picks fewer
  // where they do not pay. The head chains at most kEagle3Chain of them; with the context lookup
  // the request's text carries a round further, up to a verify window of kLookupWindow tokens.
  int num_draft = 0;
  // Whether an exact-mode row's chain is checked against the request's text's continuation: a
  // chain the text continues throughout (the head copying the text) carries the round on along
  // the text, and where the chain leaves the text while the text has been right at least as
  // often as the head, the text's token replaces the head's and the round goes on along the
  // text (context_lookup.h).
  bool context_lookup = true;
  int kv_blocks = 0;  // 0 = the engine's rows at the head's full context
};

class Eagle3Method : public DraftMethod {
 public:
  // `id` names the head in the checkpoint namespace (its folder). `target_layers` is the depth
  // of the target it will serve: needs() is asked before open(), and a head without explicit
  // aux layer ids taps the loaders' default layers of that depth.
  Eagle3Method(std::shared_ptr<Eagle3Head> head, std::string id, int target_layers, Eagle3Options options = {});
  std::string name() const override { return "eagle3"; }
  std::string checkpoint_namespace() const override;
  TargetNeeds needs() const override;
  std::unique_ptr<DraftRows> open(const TargetView& target) override;
  int default_depth() const override;
  int own_depth() const override;
  // What rows proposed from the request's text, over every group opened: tokens in place of the
  // head's and how often each side was right where a round reached them, drafts past the chain.
  const LookupStats& lookup_stats() const { return *stats_; }

 private:
  std::shared_ptr<Eagle3Head> head_;
  std::string id_;
  int target_layers_;
  Eagle3Options options_;
  std::shared_ptr<LookupStats> stats_ = std::make_shared<LookupStats>();
};

}  // namespace specdec
