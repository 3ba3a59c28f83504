// The coordinator: every draft method instance the engine serves, each with its group of rows
// (DraftRows), kept in step with the target batch. It asks each row's depth policy how deep to
// draft, batches the drafting per group, and relays prefill blocks and verified rounds to the
// groups. Rows join and leave groups only between rounds (two-phase membership).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "speculative/draft.h"
#include "speculative/policy.h"
#include "speculative/spec_options.h"
#include "speculative/telemetry.h"

namespace specdec {

// One row's speculation state, held by the engine's row; the coordinator keys it by `id`.
struct SpecRow {
  int64_t id = 0;
  std::string method;  // method instance id; empty: plain decoding
  SpecMode mode = SpecMode::exact;
  std::optional<DepthPolicy> policy;
  // The most drafts a round may ask. The policy prices depths up to its method's own depth (the
  // drafts its drafter computes, DraftMethod::own_depth); a round at that depth asks for the rest
  // of the reach, which the request's text fills where it continues the drafts.
  int reach = 0;
  SpecTelemetry telemetry;
  DraftProposal proposal;  // this round's drafts, between propose() and the forward
  bool joined = false;     // a member of its method's group
  // This round's target forward does not tap the row (Coordinator::forward_taps): its policy
  // keeps it from drafting for a while.
  bool untapped = false;
};

// A row that may draft this round: its pending token (the last known, not yet in the target's
// KV) at `position`, and the most drafts it can take (tokens left to generate, context left).
struct DraftAsk {
  SpecRow* row = nullptr;
  int32_t pending = 0;
  int64_t position = 0;
  int limit = 0;
  const SamplingParams* sampling = nullptr;
};

// A row's verified round, relayed to its group.
struct RoundOutcome {
  SpecRow* row = nullptr;
  int32_t pending = 0;                 // the token that opened the window
  int drafted = 0;
  int accepted = 0;
  std::span<const int32_t> emitted;    // accepted drafts and the target's own token
  bool finished = false;               // the row ended this round: its group learns nothing more
  TargetContext context = {};          // the verified positions' taps (accepted + 1), if asked
};

class Coordinator {
 public:
  explicit Coordinator(TargetView target);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Registers a method instance under `id` (refused when the id is taken or the method needs a
  // port the target lacks) and opens its group.
  void add_method(const std::string& id, std::shared_ptr<DraftMethod> method);
  bool has_method(const std::string& id) const { return groups_.count(id) > 0; }
  int default_depth(const std::string& id) const;
  // The most drafts the method's drafter computes itself (DraftMethod::own_depth).
  int own_depth(const std::string& id) const;
  // Whether the row's method can take another row whose context is `tokens` long.
  bool has_room(const SpecRow& row, int tokens) const;
  // Bytes of the methods' own KV caches handed out at least once (DraftRows::kv_touched_bytes).
  size_t kv_touched_bytes() const;

  // Two-phase membership: the row joins its method's group fresh (its prompt follows through
  // prefill()); leave() takes rows out of their groups.
  void join(SpecRow& row);
  void leave(std::span<SpecRow* const> rows);

  // The tap layers the row's method declared, in its order; empty when it declared none or the
  // row is not in its group.
  std::span<const int> tap_layers(const SpecRow& row) const;
  // The layers this iteration's target forward taps the row at: its method's (tap_layers), or
  // none while its depth policy keeps it from drafting beyond the next rounds (set by propose()).
  // Its prefill blocks and rounds then carry no taps: a hidden-state drafter's context misses
  // those positions.
  std::span<const int> forward_taps(const SpecRow& row) const;
  // Whether the row's next round certainly drafts nothing and goes untapped, whatever the costs
  // and the tokens before it: the next propose() will find it in a pause that does not end with
  // that round, nor in the rounds tapped before its end. Such a round's forward may be launched
  // before the round in flight is committed (propose() for it called then).
  bool quiet_next(const SpecRow& row) const;
  // Whether the last propose() asked any row for drafts.
  bool asked() const { return last_asks_ > 0; }
  // A prompt block the target processed for the row (tail split: never the pending token), with
  // the taps of its positions when the method asked for them.
  void prefill(SpecRow& row, std::span<const int32_t> tokens, const TargetContext& context);
  // A prompt block whose positions the target computed for another row (a shared cached prefix):
  // the method learns the tokens with no taps, a gap in a hidden-state drafter's context.
  void prefill_shared(SpecRow& row, std::span<const int32_t> tokens);
  // Sets each asking row's proposal: its policy picks the depth from the measured costs
  // (`decoding` rows share the forward), the row's group drafts, batched per group.
  void propose(std::span<const DraftAsk> asks, const CostModel& costs, int decoding);
  // Relays the verified rounds to the groups (each row that took part, drafted or not).
  void commit(std::span<const RoundOutcome> outcomes);
  // The wall time of the decode iteration whose drafts propose() set, one-off costs included: it
  // prices a batch's probes (what an iteration whose only draft is one row's probe costs beyond
  // one with none), which the cost fits cannot, as they leave out the one-off costs that a probe's
  // new shapes bring.
  void observe_iteration(double seconds);

 private:
  struct Group;
  Group& group(const std::string& id) const;  // throws for an unknown method id
  Group& group_of(const SpecRow& row) const;
  static void check_context(const Group& g, const SpecRow& row, const TargetContext& context, int64_t positions);

  TargetView target_;
  std::map<std::string, std::unique_ptr<Group>> groups_;
  // The last propose(): its drafting rows, and the group whose probe was its only draft.
  size_t last_asks_ = 0;
  Group* probe_only_ = nullptr;
  double plain_seconds_ = 0;  // moving average of decode iterations without drafts
  // What a rejection-mode row's policy prices its depths by: fixed figures in plain steps, not
  // the measured costs. Its tokens depend on which positions it drafted, so its depths may depend
  // only on its own rounds' outcomes for a seeded request to repeat (in a batch too).
  CostModel fixed_costs_ = CostModel::fixed(kFixedWindowToken);
  static constexpr double kFixedWindowToken = 0.1;  // a verify window's token beyond the first
  static constexpr double kFixedDraftStep = 0.1;    // a chained drafter's step (and its call's fixed part)
  static constexpr double kFixedBlock = 0.3;        // a block drafter's call
};

}  // namespace specdec
