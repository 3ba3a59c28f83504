// The speculative seam: a DraftMethod (lives as long as the server, holds weights and policy)
// opens DraftRows groups that mirror the target batch's speculating rows. Drafts are only
// proposals: the verifier and the target decide every emitted token, so a method can change
// speed, never output.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "core/weight.h"
#include "sampling/sampling.h"

namespace specdec {

class Model;

// A row's draft state between rounds. It lines up exactly with the target's KV prefix of
// `processed_tokens` tokens; restoring it into a group of another namespace is refused.
struct Checkpoint {
  int64_t processed_tokens = 0;
  std::string ns;
  nlohmann::json metadata;
  std::vector<int32_t> tokens;                        // token history the state was built from
  std::map<std::string, std::vector<float>> tensors;  // method-specific state
};

// Build-aside / swap-in membership change: commit() applies it, destruction without commit
// drops it. A failed prepare throws and leaves the group exactly as it was.
class PreparedChange {
 public:
  PreparedChange() = default;
  PreparedChange(std::function<void()> commit, std::function<void()> dispose)
      : commit_(std::move(commit)), dispose_(std::move(dispose)) {}
  PreparedChange(PreparedChange&& o) noexcept : commit_(std::move(o.commit_)), dispose_(std::move(o.dispose_)) {
    o.commit_ = nullptr;
    o.dispose_ = nullptr;
  }
  PreparedChange& operator=(PreparedChange&&) = delete;
  PreparedChange(const PreparedChange&) = delete;
  ~PreparedChange() {
    if (dispose_) dispose_();
  }
  void commit() {
    if (commit_) commit_();
    commit_ = nullptr;
    dispose_ = nullptr;
  }

 private:
  std::function<void()> commit_;
  std::function<void()> dispose_;
};

// What a method needs of the target beyond its tokens: hidden-state taps of some layers (handed
// over with each prefill block and verified round, in this order; i < L: the residual stream
// after layer i, L = num_layers: the final normed hidden), the target's embedding and LM head (a head
// that reuses them instead of holding copies), read access to the target's KV (an assistant
// head that attends to it).
struct TargetNeeds {
  std::vector<int> tap_layers;
  bool embedding = false;
  bool lm_head = false;
  bool kv = false;
  // A row whose depth policy pauses it is not tapped; this many rounds before the pause may end
  // in a probe that decides whether the row drafts again, it is tapped again: the positions just
  // before the pending token weigh most in what a hidden-state drafter proposes.
  int resume_taps = 1;
};

// The ports a target offers a method. A method needing a port the target lacks fails when it is
// registered, before any row state exists.
struct TargetView {
  const Model* model = nullptr;
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int max_rows = 0;  // rows the engine runs at once: a method sizes its per-row state for them
  // Ports offered (null: not offered). The embedding table and the LM head are views of the
  // target's own weights in its backend's memory, valid as long as the target: a head that
  // reuses them holds no copy.
  bool taps = false;
  const Tensor* embedding = nullptr;  // [vocab, hidden]
  const Weight* lm_head = nullptr;    // [vocab, hidden]; a tied target's is the embedding table
  bool kv = false;
};

// The target's hidden states for one row's positions, as the method asked for them
// (TargetNeeds::tap_layers): taps[j] is a [positions, hidden] f32 view of layer tap_layers[j]
// in the target backend's memory. The views are valid during the call that hands them over
// only (the next target forward reuses the memory): a method copies what it keeps. Empty for
// a method that declared no taps, and for positions the target did not tap (a paused row's
// rounds, a prefix whose KV came from elsewhere): a method's context then misses them, and it
// drafts from the positions tapped after them.
struct TargetContext {
  std::vector<Tensor> taps;

  bool empty() const { return taps.empty(); }
  int64_t positions() const { return taps.empty() ? 0 : taps.front().dim(0); }
};

// Throws a clear Error naming the first port `needs` asks for that `target` does not offer.
void check_ports(const TargetView& target, const TargetNeeds& needs, const std::string& method);

// One row of a draft() call: draft up to `depth` tokens after `pending` (the last emitted token,
// not yet in the target's KV), whose absolute position is `position`.
struct DraftRequestRow {
  int row = 0;
  int32_t pending = 0;
  int depth = 0;
  int64_t position = 0;
  const SamplingParams* sampling = nullptr;  // the request's params; draft i samples at key_position(i)
  bool want_q = false;                       // rejection mode: also return the draft distributions
  // The row's depth policy chose `depth` from its costs and the row's acceptance: a method's own
  // shortening of the proposal then stands aside (the policy prices every depth).
  bool adaptive = false;
  // The price of the row's verify window this round, from the engine's measured costs (empty
  // until they are measured, and for a rejection-mode row, whose depths may not depend on them): window_seconds[w - 1]
  // is a window of w tokens, w = 1..depth + 1, and draft_seconds the row's share of a draft call of this depth. A
  // method that shortens its proposal per row (a block drafter's confidence cut) weighs its drafts against them.
  std::vector<double> window_seconds = {};
  double draft_seconds = 0;

  // The key position of draft i's coupled draw: the target's own key for the token it stands for.
  uint64_t key_position(int draft) const { return static_cast<uint64_t>(position) + 1 + static_cast<uint64_t>(draft); }
};

struct DraftProposal {
  std::vector<int32_t> tokens;        // 0..depth tokens; 0 means a plain target step
  std::vector<std::vector<float>> q;  // per token, the full draft distribution (when asked)
  // Context tokens the method had to process first beyond a round's usual one or two (the
  // tokens of rounds the row did not draft in): their cost is a resumption's, not the drafts'.
  int caught_up = 0;
  // The call paid one-off costs (a draft forward grew its buffers or ran a shape it had not
  // replayed yet, recording it): its time says little about the next call's.
  bool one_off = false;
};

// What the target verified for one row this round.
struct RowCommit {
  int row = 0;
  int32_t pending = 0;           // the token that opened the round's window
  int accepted = 0;              // drafts accepted (0..drafted)
  std::vector<int32_t> emitted;  // accepted drafts followed by the target's own token
  int drafted = 0;               // drafts proposed this round
  // The hidden states of the verified positions: pending and the accepted drafts (accepted + 1
  // rows), when the method declared taps.
  TargetContext context = {};
};

class DraftRows {
 public:
  virtual ~DraftRows() = default;
  virtual int row_count() const = 0;
  // New rows join at the end, each from a checkpoint or empty (nullptr).
  virtual PreparedChange prepare_append(std::span<const Checkpoint* const> checkpoints) = 0;
  // Keeps rows `keep` (ascending indices into the current rows), in that order.
  virtual void filter_rows(std::span<const int> keep) = 0;
  // A block of prompt tokens the target has processed for `row` (tail split: never the last
  // prompt token, which stays pending), with the target's hidden states of every one of them
  // when the method declared taps.
  virtual void prefill(int row, std::span<const int32_t> tokens, const TargetContext& context) = 0;
  // Drafts for the listed rows, batched; result[i] belongs to rows[i].
  virtual std::vector<DraftProposal> draft(std::span<const DraftRequestRow> rows) = 0;
  // The verified outcome of the round for the listed rows (every row that took part in the
  // target forward, drafted or not), so the method's state tracks the target's.
  virtual void commit(std::span<const RowCommit> commits) = 0;
  // The row's state between rounds.
  virtual Checkpoint capture(int row) const = 0;
  // Whether one more row with `tokens` of context fits the group's own state (a draft model's
  // KV); a row that does not fit decodes plainly. A full state during a round is no error
  // either: the rows it cannot hold draft nothing that round.
  virtual bool has_room(int tokens) const {
    (void)tokens;
    return true;
  }
  // Bytes of the group's own KV cache handed out at least once (KvCache::touched_bytes); 0 for
  // a method without one.
  virtual size_t kv_touched_bytes() const { return 0; }
};

class DraftMethod {
 public:
  virtual ~DraftMethod() = default;
  virtual std::string name() const = 0;
  // Schema and every policy knob, e.g. "ngram-history-v1:3:1:10".
  virtual std::string checkpoint_namespace() const = 0;
  // What this method needs of the target (checked against the target's ports before open()).
  virtual TargetNeeds needs() const { return {}; }
  virtual std::unique_ptr<DraftRows> open(const TargetView& target) = 0;
  // Default maximum draft depth for this method.
  virtual int default_depth() const = 0;
  // The most drafts a call's drafter computes itself. A round asked deeper than this is carried
  // on by the request's text (a hidden-state drafter's context lookup), at no cost of the drafter:
  // its calls are priced as of this depth.
  virtual int own_depth() const { return default_depth(); }
  // Whether a draft call is one forward whatever its depth (a block drafter) rather than a
  // forward per draft: how the engine prices depths it has not measured.
  virtual bool drafts_in_one_forward() const { return false; }
};

// Refuses a checkpoint from another namespace or one that does not line up with the tokens.
void check_checkpoint(const Checkpoint& checkpoint, const std::string& ns);

}  // namespace specdec
