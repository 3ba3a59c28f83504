// Eagle3Rows: per row, `known` = the tokens in the target's KV before the pending one, and a head
// KV whose first `fed` positions are real: each holds the pair (token at target position t+1,
// fused taps of target position t) for a tapped position t, in order. The taps of the tapped
// positions after them wait in the backend's memory until a draft call feeds them, together with
// the tokens that follow them (the last of which is the pending token): a row that drafts now
// and then catches up on all its waiting positions in one forward when it drafts. Positions the
// target did not tap (the engine taps no row that its depth policy keeps from drafting for a
// while) are a gap in the head's context: the pairs before and after it sit next to each other.
// Positions past `fed` are the previous round's chained guesses and are cut off before anything
// is fed: rollback, never recompute.
#include "speculative/methods/eagle3.h"

#include <algorithm>
#include <array>
#include <limits>

#include "core/error.h"
#include "model/replay.h"
#include "sampling/sampling.h"
#include "speculative/methods/kv_rows.h"
#include "speculative/methods/pending_taps.h"

namespace specdec {

namespace {

// Waiting positions past which a commit feeds them into the head without waiting for a draft
// call: a row that drafts nothing for long holds that many positions' taps at most.
constexpr int64_t kMaxWaiting = 128;

struct Eagle3RowState {
  std::vector<int32_t> known;
  KvCache::SeqId seq = 0;
  int64_t fed = 0;      // real head positions
  PendingTaps waiting;  // the taps of tapped positions not fed yet, oldest first
  // The token after each waiting position, as far as it is known: one fewer than waiting when the
  // last waiting position is the one before the pending token (a draft call brings that token);
  // as many when positions without taps followed it.
  std::vector<int32_t> pairs;
  int64_t last_round = 0;  // positions the last commit delivered (a round's usual feed)
  ContextLookup lookup;    // the request's text's continuation past the chain (context_lookup.h)
};

class Eagle3Rows : public DraftRows {
 public:
  Eagle3Rows(std::shared_ptr<Eagle3Head> head, std::string ns, const Tensor* embedding, const Weight* lm_head,
             int kv_blocks, int max_draft, int reach, bool lookup, std::shared_ptr<LookupStats> stats)
      : head_(std::move(head)),
        ns_(std::move(ns)),
        embedding_(embedding),
        lm_head_(lm_head),
        cache_(head_->make_cache(kv_blocks)),
        max_draft_(max_draft),
        reach_(reach),
        lookup_(lookup),
        stats_(std::move(stats)) {
    const Eagle3Config& c = head_->config();
    if (lm_head_) head_->use_target_rows(*lm_head_);
    width_ = 3 * static_cast<size_t>(c.target_hidden);
    vocab_ = static_cast<size_t>(c.layer.vocab_size);
  }
  ~Eagle3Rows() override {
    for (auto& r : rows_) cache_->release(r.seq);
  }

  int row_count() const override { return static_cast<int>(rows_.size()); }

  bool has_room(int tokens) const override {
    const int block = cache_->block_size();
    return (tokens + block) / block <= cache_->free_blocks();
  }
  size_t kv_touched_bytes() const override { return cache_->touched_bytes(); }

  PreparedChange prepare_append(std::span<const Checkpoint* const> checkpoints) override {
    auto added = std::make_shared<std::vector<Eagle3RowState>>();
    for (const Checkpoint* cp : checkpoints) {
      if (cp) check_checkpoint(*cp, ns_);
      Eagle3RowState row;
      row.seq = cache_->create();
      // The taps of a restored prefix are gone: the head starts after it, at the first position
      // whose taps a round delivers.
      if (cp) {
        row.known = cp->tokens;
        note(row.known);
      }
      added->push_back(std::move(row));
    }
    return append_on_commit(rows_, added, *cache_);
  }

  void filter_rows(std::span<const int> keep) override { keep_rows(rows_, keep, *cache_); }

  void prefill(int row, std::span<const int32_t> tokens, const TargetContext& context) override {
    auto& r = rows_.at(static_cast<size_t>(row));
    take_features(r, tokens, context);
    r.last_round = 0;
  }

  void commit(std::span<const RowCommit> commits) override {
    for (const RowCommit& c : commits) {
      auto& r = rows_.at(static_cast<size_t>(c.row));
      verified_.assign(1, c.pending);
      verified_.insert(verified_.end(), c.emitted.begin(), c.emitted.end() - 1);
      take_features(r, verified_, c.context);
      r.last_round = static_cast<int64_t>(verified_.size());
      r.lookup.commit(c, *stats_);
    }
  }

  Checkpoint capture(int row) const override {
    const auto& r = rows_.at(static_cast<size_t>(row));
    Checkpoint cp;
    cp.ns = ns_;
    cp.tokens = r.known;
    cp.processed_tokens = static_cast<int64_t>(r.known.size());
    return cp;
  }

  std::vector<DraftProposal> draft(std::span<const DraftRequestRow> asks) override {
    return with_context("EAGLE-3 head", [&] {
      std::vector<DraftProposal> out = chain_rows(asks);
      for (size_t i = 0; i < asks.size(); ++i) carry_on(asks[i], rows_.at(static_cast<size_t>(asks[i].row)), out[i]);
      return out;
    });
  }

 private:
  Backend& backend() const { return head_->backend(); }
  void note(std::span<const int32_t> tokens) {
    if (lm_head_) head_->note_context(tokens, *lm_head_);
  }

  // New target positions with these tokens, and their taps (device copies, nothing waited for)
  // unless the target did not tap them: then they are a gap in the head's context, and the taps
  // still waiting before it are fed later all the same (the pairs say which token follows each).
  void take_features(Eagle3RowState& r, std::span<const int32_t> tokens, const TargetContext& context) {
    if (tokens.empty()) return;
    const auto n = static_cast<int64_t>(tokens.size());
    if (r.pairs.size() < static_cast<size_t>(r.waiting.size())) r.pairs.push_back(tokens.front());
    r.known.insert(r.known.end(), tokens.begin(), tokens.end());
    note(tokens);
    if (context.empty()) return;
    SPECDEC_CHECK(context.taps.size() == 3 && context.positions() == n, "EAGLE-3 head: expected 3 taps x ", n,
                  " positions, got ", context.taps.size(), " x ", context.positions());
    r.waiting.append(backend(), context);
    r.pairs.insert(r.pairs.end(), tokens.begin() + 1, tokens.end());
    if (r.waiting.size() > kMaxWaiting) {
      feed_known(r);
      r.waiting.trim(backend(), 2 * kMaxWaiting);
    }
  }

  // Feeds a row's waiting positions whose next tokens are known into the head (all but the last
  // one when its next token is the pending one, which a draft call brings). Bounds what a row that
  // does not draft holds; a head KV that cannot take them restarts the row after them instead.
  void feed_known(Eagle3RowState& r) {
    const auto n = static_cast<int64_t>(r.pairs.size());
    if (n == 0) return;
    cache_->truncate(r.seq, static_cast<int>(r.fed));
    if (r.fed + n + 1 > head_->config().layer.max_position || !cache_->reserve(r.seq, static_cast<int>(r.fed + n))) {
      cache_->truncate(r.seq, 0);
      r.fed = 0;
      r.waiting.consume(n);
      r.pairs.clear();
      return;
    }
    Eagle3Head::Row row;
    row.seq = r.seq;
    row.tokens = r.pairs;
    const std::array<Eagle3RowState*, 1> rows{&r};
    const std::array<int64_t, 1> counts{n};
    head_->forward(std::span<const Eagle3Head::Row>(&row, 1), fuse(rows, counts), true, embedding_, *cache_);
    r.fed += n;
    r.waiting.consume(n);
    r.pairs.clear();
  }

  // The first counts[i] waiting positions of rows[i] as the [positions, 3 * target_hidden] fused
  // input fc reads (each position's three taps side by side), gathered in the backend's memory:
  // one row after another, or with `pad` > 0 each row's in `pad` positions, its last repeated.
  Tensor fuse(std::span<Eagle3RowState* const> rows, std::span<const int64_t> counts, int pad = 0) {
    const int64_t h = static_cast<int64_t>(width_ / 3);
    int64_t total = 0;
    gather_index_.clear();
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t n = pad > 0 ? pad : counts[i];
      for (int64_t p = 0; p < n; ++p)
        for (int j = 0; j < 3; ++j)
          gather_index_.push_back(static_cast<int32_t>(rows[i]->waiting.row_of(j, std::min(p, counts[i] - 1))));
      total += n;
    }
    const size_t index_bytes = (gather_index_.size() * sizeof(int32_t) + 255) / 256 * 256;
    const size_t input_bytes = static_cast<size_t>(total) * width_ * sizeof(float);
    // An outgrown buffer may go at once: a device backend frees it after the queued calls.
    if (gather_buffer_.bytes() < index_bytes + input_bytes)
      gather_buffer_ = backend().allocate(2 * (index_bytes + input_bytes));
    const Tensor index = gather_buffer_.view(DType::i32, {static_cast<int64_t>(gather_index_.size())});
    const Tensor fused(static_cast<char*>(gather_buffer_.data()) + index_bytes, DType::f32, {3 * total, h},
                       gather_buffer_.device());
    backend().copy(Tensor(gather_index_.data(), DType::i32, {static_cast<int64_t>(gather_index_.size())}), index);
    int64_t at = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t n = pad > 0 ? pad : counts[i];
      backend().gather_rows(rows[i]->waiting.storage(), index.rows(3 * at, 3 * n), fused.rows(3 * at, 3 * n));
      at += n;
    }
    return fused.reshape({total, 3 * h});
  }

  // Each asking row's chain: the drafts the head computes, up to chain(ask).
  std::vector<DraftProposal> chain_rows(std::span<const DraftRequestRow> asks) {
    std::vector<DraftProposal> out(asks.size());
    const int64_t max_position = head_->config().layer.max_position;
    // Step 0 feeds each row's waiting positions: the tokens paired with them, the last of which
    // is the pending one, with their waiting taps.
    std::vector<size_t> live;
    std::vector<Eagle3Head::Row> step_rows;
    std::vector<Eagle3RowState*> feeding;
    std::vector<int64_t> counts;
    for (size_t i = 0; i < asks.size(); ++i) {
      auto& r = rows_.at(static_cast<size_t>(asks[i].row));
      cache_->truncate(r.seq, static_cast<int>(r.fed));
      const int64_t waiting = r.waiting.size();
      // The drafts follow from the taps of the position before the pending token: without them
      // (not there yet, or not tapped) the row drafts nothing this round.
      if (asks[i].depth <= 0 || waiting == 0 || static_cast<int64_t>(r.pairs.size()) != waiting - 1) continue;
      if (r.fed + waiting + chain(asks[i]) > max_position) continue;             // the head's context is full
      if (!cache_->reserve(r.seq, static_cast<int>(r.fed + waiting))) continue;  // a full head KV pauses the row
      Eagle3Head::Row row;
      row.seq = r.seq;
      row.tokens = r.pairs;
      row.tokens.push_back(asks[i].pending);
      row.outputs_at = {static_cast<int32_t>(waiting - 1)};
      // A round feeds the positions the last one verified; more than that is catching up (a
      // prompt, or rounds the row did not draft in).
      out[i].caught_up = static_cast<int>(std::max<int64_t>(0, waiting - std::max<int64_t>(1, r.last_round)));
      step_rows.push_back(std::move(row));
      feeding.push_back(&r);
      counts.push_back(waiting);
      live.push_back(i);
    }
    if (live.empty()) return out;
    if (const int deepest = chain_depth(asks, live); chain_on_device(asks, live, counts, deepest)) {
      const Tensor inputs = fuse(feeding, counts, head_->step0_width(step_rows));
      const size_t R = live.size();
      // Sampled rows draw their drafts in the chain, at the keys the host draw would use; a greedy
      // row beside them takes the argmax there too (a SampleRow of temperature 0).
      draws_.clear();
      if (std::any_of(live.begin(), live.end(), [&](size_t i) { return !asks[i].sampling->selects_argmax(); })) {
        draws_.resize(static_cast<size_t>(deepest) * R);
        for (int k = 0; k < deepest; ++k)
          for (size_t j = 0; j < R; ++j) {
            const DraftRequestRow& ask = asks[live[j]];
            draws_[static_cast<size_t>(k) * R + j] = sample_row(*ask.sampling, ask.key_position(k));
          }
      }
      const Eagle3Head::Drafts d = head_->draft_chain(step_rows, inputs, deepest, embedding_, *cache_, draws_);
      for (size_t j = 0; j < R; ++j) {
        const size_t i = live[j];
        auto& r = rows_[static_cast<size_t>(asks[i].row)];
        r.fed += static_cast<int64_t>(step_rows[j].tokens.size());
        r.waiting.clear();
        r.pairs.clear();
        for (int k = 0; k < chain(asks[i]); ++k) {
          const int32_t id = d.ids[static_cast<size_t>(k) * R + j];
          if (id < 0) break;  // a NaN logit: no drafts from there on
          out[i].tokens.push_back(id);
        }
        out[i].one_off = d.one_off;
      }
      return out;
    }
    const Tensor inputs = fuse(feeding, counts);
    std::vector<float> chained;
    bool fused = true;
    // Steps after the first write KV that the next round cuts back; without rejection rows their
    // logits only choose drafts: they may run on the backend's fast kernels.
    const bool any_q = std::any_of(live.begin(), live.end(), [&](size_t i) { return asks[i].want_q; });
    for (int step = 0; !live.empty(); ++step) {
      const FastKernelScope fast(head_->backend(), !fused && !any_q);
      const Eagle3Head::Output res = fused ? head_->forward(step_rows, inputs, true, embedding_, *cache_)
                                           : head_->forward(step_rows, chained, false, embedding_, *cache_);
      const size_t vd = static_cast<size_t>(head_->logit_columns());
      const size_t h = static_cast<size_t>(head_->config().layer.hidden_size);
      std::vector<size_t> next;
      std::vector<Eagle3Head::Row> next_rows;
      std::vector<float> next_inputs;
      for (size_t j = 0; j < live.size(); ++j) {
        const size_t i = live[j];
        auto& r = rows_[static_cast<size_t>(asks[i].row)];
        if (step == 0) {
          r.fed += static_cast<int64_t>(step_rows[j].tokens.size());
          r.waiting.clear();
          r.pairs.clear();
        }
        const std::span<const float> logits(res.logits.data() + j * vd, vd);
        const int32_t token = draw(asks[i], r, logits, out[i], step);
        out[i].tokens.push_back(token);
        if (static_cast<int>(out[i].tokens.size()) >= chain(asks[i])) continue;
        const int len = cache_->length(r.seq);
        if (!cache_->reserve(r.seq, len + 1)) continue;  // stops with the drafts it has
        next.push_back(i);
        next_rows.push_back(Eagle3Head::Row{r.seq, {token}, {0}});
        next_inputs.insert(next_inputs.end(), res.hidden.begin() + static_cast<std::ptrdiff_t>(j * h),
                           res.hidden.begin() + static_cast<std::ptrdiff_t>((j + 1) * h));
      }
      live = std::move(next);
      step_rows = std::move(next_rows);
      chained = std::move(next_inputs);
      fused = false;
    }
    return out;
  }

  // The drafts a row's chain runs to: its depth, at most the chain's.
  int chain(const DraftRequestRow& ask) const { return std::min(ask.depth, max_draft_); }

  // The request's text against the chain. A row whose whole chain is what followed the same
  // tokens earlier in the text (the head is copying it: an edit of its source, a repeated block)
  // and that asked for more goes on along the text while it continues; the chain alone would end
  // such rounds at its length, every draft accepted. A round at the chain's depth asks for these
  // (Coordinator::propose); they cost no head step. Where the chain first leaves the text's
  // continuation, the text's token replaces the head's while the text has been right there at
  // least as often as the head on this request (ContextLookup::choose), and the round goes on
  // along the text: the head's later drafts followed its own token. A head that sees a few
  // lines back cannot count repeats (three arguments a line, then a line break): the text's
  // latest long match can. Exact-mode rows only: a rejection-mode row's drafts must be its own
  // draws.
  void carry_on(const DraftRequestRow& ask, Eagle3RowState& r, DraftProposal& p) {
    if (!lookup_ || ask.want_q || p.tokens.empty()) return;
    const int drafted = static_cast<int>(p.tokens.size());
    const int reach = drafted == max_draft_ ? std::max(drafted, std::min(ask.depth, reach_)) : drafted;
    r.lookup.begin(r.known, ask.pending);
    bool copying = true, swapped = false;
    for (int j = 0; j < drafted && !swapped; ++j) {
      const ContextLookup::Choice c = r.lookup.choose(j, p.tokens[static_cast<size_t>(j)], *stats_);
      if (c.token != p.tokens[static_cast<size_t>(j)]) {
        p.tokens.resize(static_cast<size_t>(j));
        p.tokens.push_back(c.token);
        swapped = true;
      }
      copying = copying && c.agreed;
    }
    for (int j = static_cast<int>(p.tokens.size()); (copying || swapped) && j < reach; ++j) {
      const int32_t t = r.lookup.extend(*stats_);
      if (t < 0) break;
      p.tokens.push_back(t);
    }
    r.lookup.end();
  }

  // The depth a chain on the device runs to: the deepest row's, and where chains are recorded, rounded
  // up to a power of two (at most the method's depth). A chain is recorded per depth, and every
  // shape pays a few calls one by one before it replays; the policy's depths wander from round
  // to round, so fewer depths mean fewer such calls, for a step or two more of a head whose step
  // is a few small kernels.
  int chain_depth(std::span<const DraftRequestRow> asks, std::span<const size_t> live) const {
    int deepest = 0;
    for (const size_t i : live) deepest = std::max(deepest, chain(asks[i]));
    if (!head_->replays_chains()) return deepest;
    return std::max(deepest, std::min(ReplayCache::pow2(deepest), max_draft_));
  }

  // Whether the live rows draft their whole chain on the device: every one draws from its logits
  // alone (no penalty reads the history, no bias: Backend::sample draws it) and wants no
  // distributions (rejection mode weighs them on the host), and each one's head KV takes the
  // chain of `deepest` (the shallower rows run the extra steps, and drop what they bring).
  bool chain_on_device(std::span<const DraftRequestRow> asks, std::span<const size_t> live,
                       std::span<const int64_t> counts, int deepest) {
    for (const size_t i : live)
      if (!draws_on_backend(*asks[i].sampling, asks[i].want_q)) return false;
    const int64_t max_position = head_->config().layer.max_position;
    for (size_t j = 0; j < live.size(); ++j) {
      const auto& r = rows_[static_cast<size_t>(asks[live[j]].row)];
      const int64_t end = r.fed + counts[j] + deepest - 1;  // head positions once the chain ran
      if (end + 1 > max_position || !cache_->reserve(r.seq, static_cast<int>(end))) return false;
    }
    return true;
  }

  // The coupled draw of draft `step`: the target's key for its position, over the target
  // vocabulary with every token outside the draft vocabulary (and its context rows) at zero
  // probability. A rejection-mode row draws from the draft vocabulary alone: its output follows
  // its drafts, and the context rows hold what every row of the drafter has seen, so a seeded
  // request would otherwise depend on the requests beside and before it.
  int32_t draw(const DraftRequestRow& ask, const Eagle3RowState& r, std::span<const float> draft_logits,
               DraftProposal& out, int step) {
    const std::span<const int32_t> to_target = head_->draft_to_target();
    const SamplingParams& params = *ask.sampling;
    if (ask.want_q) draft_logits = draft_logits.first(static_cast<size_t>(head_->config().draft_vocab));
    if (params.selects_argmax() && !ask.want_q) {
      // The argmax over the draft vocabulary is the argmax over the scattered logits, up to ties.
      return to_target[static_cast<size_t>(argmax(draft_logits))];
    }
    full_.assign(vocab_, -std::numeric_limits<float>::infinity());
    for (size_t d = 0; d < draft_logits.size(); ++d) full_[static_cast<size_t>(to_target[d])] = draft_logits[d];
    const std::span<const int32_t> generated(out.tokens);
    const int32_t token = sample(full_, params, r.known, generated, ask.key_position(step));
    if (ask.want_q) out.q.push_back(probabilities(full_, params, r.known, generated));
    return token;
  }

  std::shared_ptr<Eagle3Head> head_;
  std::string ns_;
  const Tensor* embedding_;  // the target's table, or null when the head has its own
  const Weight* lm_head_;    // the target's LM head (the head's context rows), or null
  std::unique_ptr<KvCache> cache_;
  std::vector<Eagle3RowState> rows_;
  size_t width_ = 0;  // floats of one position's fused taps
  size_t vocab_ = 0;
  int max_draft_;  // the deepest a round's chain runs
  int reach_;      // the deepest a round may ask, the text's continuation past the chain included
  bool lookup_;    // exact-mode rows whose chain copies the text carry on along it
  std::shared_ptr<LookupStats> stats_;
  std::vector<float> full_;
  std::vector<SampleRow> draws_;  // a sampled chain's keys, [depth][rows] (kept: a round allocates nothing for them)
  std::vector<int32_t> verified_;      // a commit's verified tokens (kept: a round allocates nothing for them)
  std::vector<int32_t> gather_index_;  // host side of the last fuse()'s gather (the copy reads it at once)
  Buffer gather_buffer_;               // that gather's index and fused inputs, in the backend's memory
};

}  // namespace

Eagle3Method::Eagle3Method(std::shared_ptr<Eagle3Head> head, std::string id, int target_layers, Eagle3Options options)
    : head_(std::move(head)), id_(std::move(id)), target_layers_(target_layers), options_(options) {
  SPECDEC_CHECK(head_ != nullptr, "no EAGLE-3 head");
  SPECDEC_CHECK(options_.num_draft >= 0, "draft depth must not be negative, got ", options_.num_draft);
}

std::string Eagle3Method::checkpoint_namespace() const {
  return str_cat("eagle3-v1:", id_, ":", head_->config().draft_vocab);
}

TargetNeeds Eagle3Method::needs() const {
  TargetNeeds n;
  n.tap_layers = head_->config().tap_layers(target_layers_);
  n.embedding = !head_->has_embedding();
  // After a gap in its context the head drafts from the taps of the last position about as well
  // as from every position: its own KV holds the pairs from before the gap.
  n.resume_taps = 1;
  return n;
}

std::unique_ptr<DraftRows> Eagle3Method::open(const TargetView& target) {
  const Eagle3Config& c = head_->config();
  SPECDEC_CHECK(target.num_layers == target_layers_, "the EAGLE-3 head ", id_, " was set up for a target of ",
                target_layers_, " layers, but this target has ", target.num_layers);
  SPECDEC_CHECK(c.layer.vocab_size == target.vocab_size, "the EAGLE-3 head ", id_, " has vocab_size ",
                c.layer.vocab_size, " but the target's vocabulary has ", target.vocab_size, " tokens");
  SPECDEC_CHECK(c.target_hidden == target.hidden_size, "the EAGLE-3 head ", id_, " reads taps of width ",
                c.target_hidden, " but the target's hidden size is ", target.hidden_size);
  if (!head_->has_embedding()) {
    SPECDEC_CHECK(target.embedding && target.embedding->dim(1) == c.layer.hidden_size, "the EAGLE-3 head ", id_,
                  " has hidden size ", c.layer.hidden_size, " and no embed_tokens of its own, so it needs the ",
                  "target's embedding of that width");
  }
  int blocks = options_.kv_blocks;
  if (blocks <= 0) blocks = std::max(1, target.max_rows) * ((c.layer.max_position + 15) / 16 + 1);
  return std::make_unique<Eagle3Rows>(head_, checkpoint_namespace(),
                                      head_->has_embedding() ? nullptr : target.embedding, target.lm_head, blocks,
                                      own_depth(), default_depth(), options_.context_lookup, stats_);
}

int Eagle3Method::default_depth() const {
  if (options_.num_draft > 0) return options_.num_draft;
  return options_.context_lookup ? std::max(kEagle3Chain, kLookupWindow - 1) : kEagle3Chain;
}

int Eagle3Method::own_depth() const { return std::min(default_depth(), kEagle3Chain); }

}  // namespace specdec
