// Eagle3Rows: per row, `known` = the tokens in the target's KV before the pending one, and a head
// KV whose first `fed` positions are real: head position j holds the pair (token at target
// position base+j+1, fused taps of target position base+j). The taps of the positions after them
// wait in `features` until a draft call feeds them, together with the tokens that follow them
// (the last of which is the pending token). Positions past `fed` are the previous round's chained
// guesses and are cut off before anything is fed: rollback, never recompute.
#include "speculative/methods/eagle3.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "sampling/sampling.h"
#include "speculative/methods/kv_rows.h"

namespace specdec {

namespace {

struct Eagle3RowState {
  std::vector<int32_t> known;
  KvCache::SeqId seq = 0;
  int64_t base = 0;             // target position of head position 0 (a restored row starts late)
  int64_t fed = 0;              // real head positions
  std::vector<float> features;  // [waiting positions, 3 * target_hidden], fused order
  bool broken = false;          // a block arrived without taps: no draft until the next reset
  int64_t last_round = 0;       // positions the last commit delivered (a round's usual feed)
};

class Eagle3Rows : public DraftRows {
 public:
  Eagle3Rows(std::shared_ptr<Eagle3Head> head, std::string ns, const Tensor* embedding, int kv_blocks)
      : head_(std::move(head)), ns_(std::move(ns)), embedding_(embedding), cache_(head_->make_cache(kv_blocks)) {
    const Eagle3Config& c = head_->config();
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

  PreparedChange prepare_append(std::span<const Checkpoint* const> checkpoints) override {
    auto added = std::make_shared<std::vector<Eagle3RowState>>();
    for (const Checkpoint* cp : checkpoints) {
      if (cp) check_checkpoint(*cp, ns_);
      Eagle3RowState row;
      row.seq = cache_->create();
      if (cp) {
        // The taps of a restored prefix are gone: the head starts after it, at the first
        // position whose taps a round delivers.
        row.known = cp->tokens;
        row.base = static_cast<int64_t>(row.known.size());
      }
      added->push_back(std::move(row));
    }
    return append_on_commit(rows_, added, *cache_);
  }

  void filter_rows(std::span<const int> keep) override { keep_rows(rows_, keep, *cache_); }

  void prefill(int row, std::span<const int32_t> tokens, const TargetContext& context) override {
    auto& r = rows_.at(static_cast<size_t>(row));
    r.known.insert(r.known.end(), tokens.begin(), tokens.end());
    take_features(r, context, static_cast<int64_t>(tokens.size()));
    r.last_round = 0;
  }

  void commit(std::span<const RowCommit> commits) override {
    for (const RowCommit& c : commits) {
      auto& r = rows_.at(static_cast<size_t>(c.row));
      r.known.push_back(c.pending);
      r.known.insert(r.known.end(), c.emitted.begin(), c.emitted.end() - 1);
      take_features(r, c.context, 1 + static_cast<int64_t>(c.accepted));
      r.last_round = 1 + static_cast<int64_t>(c.accepted);
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
    return with_context("EAGLE-3 head", [&] { return draft_rows(asks); });
  }

 private:
  // Copies the taps of `positions` new target positions to the host, fused in fc's order.
  void take_features(Eagle3RowState& r, const TargetContext& context, int64_t positions) {
    if (context.empty()) {
      // No taps for these positions (a prefix restored from elsewhere): restart the head after
      // them; it drafts again once a round brings taps.
      r.broken = true;
      return;
    }
    SPECDEC_CHECK(context.taps.size() == 3 && context.positions() == positions, "EAGLE-3 head: expected 3 taps x ",
                  positions, " positions, got ", context.taps.size(), " x ", context.positions());
    const size_t h = width_ / 3;
    staging_.resize(static_cast<size_t>(positions) * h);
    const size_t old = r.features.size();
    r.features.resize(old + static_cast<size_t>(positions) * width_);
    for (size_t j = 0; j < 3; ++j) {
      head_->backend().copy(context.taps[j], Tensor(staging_.data(), DType::f32, {positions, static_cast<int64_t>(h)}));
      head_->backend().synchronize();
      for (int64_t p = 0; p < positions; ++p)
        std::copy_n(staging_.data() + static_cast<size_t>(p) * h, h,
                    r.features.data() + old + static_cast<size_t>(p) * width_ + j * h);
    }
  }

  // A row whose taps have a gap starts over at its current end: the next round's taps open it.
  void reset_if_broken(Eagle3RowState& r) {
    if (!r.broken) return;
    cache_->truncate(r.seq, 0);
    r.base = static_cast<int64_t>(r.known.size());
    r.fed = 0;
    r.features.clear();
    r.broken = false;
  }

  std::vector<DraftProposal> draft_rows(std::span<const DraftRequestRow> asks) {
    std::vector<DraftProposal> out(asks.size());
    const int64_t max_position = head_->config().layer.max_position;
    // Step 0 feeds each row's waiting positions: tokens known[base+fed+1 ..] + pending, paired
    // with their waiting taps.
    std::vector<size_t> live;
    std::vector<Eagle3Head::Row> step_rows;
    std::vector<float> inputs;
    for (size_t i = 0; i < asks.size(); ++i) {
      auto& r = rows_.at(static_cast<size_t>(asks[i].row));
      reset_if_broken(r);
      cache_->truncate(r.seq, static_cast<int>(r.fed));
      const int64_t waiting = static_cast<int64_t>(r.features.size() / width_);
      const int64_t known = static_cast<int64_t>(r.known.size());
      if (asks[i].depth <= 0 || waiting == 0) continue;  // the taps before the pending token are not there yet
      SPECDEC_CHECK(r.base + r.fed + waiting == known, "row ", asks[i].row, ": ", waiting,
                    " waiting tap positions do not line up with ", known, " known tokens");
      if (r.fed + waiting + asks[i].depth > max_position) continue;              // the head's context is full
      if (!cache_->reserve(r.seq, static_cast<int>(r.fed + waiting))) continue;  // a full head KV pauses the row
      Eagle3Head::Row row;
      row.seq = r.seq;
      row.tokens.assign(r.known.begin() + (r.base + r.fed + 1), r.known.end());
      row.tokens.push_back(asks[i].pending);
      row.outputs_at = {static_cast<int32_t>(waiting - 1)};
      // A round feeds the positions the last one verified; more than that is catching up (a
      // prompt, or rounds the row did not draft in).
      out[i].caught_up = static_cast<int>(std::max<int64_t>(0, waiting - std::max<int64_t>(1, r.last_round)));
      step_rows.push_back(std::move(row));
      inputs.insert(inputs.end(), r.features.begin(), r.features.end());
      live.push_back(i);
    }
    bool fused = true;
    for (int step = 0; !live.empty(); ++step) {
      const Eagle3Head::Output res = head_->forward(step_rows, inputs, fused, embedding_, *cache_);
      const size_t vd = static_cast<size_t>(head_->config().draft_vocab);
      const size_t h = static_cast<size_t>(head_->config().layer.hidden_size);
      std::vector<size_t> next;
      std::vector<Eagle3Head::Row> next_rows;
      std::vector<float> next_inputs;
      for (size_t j = 0; j < live.size(); ++j) {
        const size_t i = live[j];
        auto& r = rows_[static_cast<size_t>(asks[i].row)];
        if (step == 0) {
          r.fed += static_cast<int64_t>(step_rows[j].tokens.size());
          r.features.clear();
        }
        const std::span<const float> logits(res.logits.data() + j * vd, vd);
        const int32_t token = draw(asks[i], r, logits, out[i], step);
        out[i].tokens.push_back(token);
        if (static_cast<int>(out[i].tokens.size()) >= asks[i].depth) continue;
        const int len = cache_->length(r.seq);
        if (!cache_->reserve(r.seq, len + 1)) continue;  // stops with the drafts it has
        next.push_back(i);
        next_rows.push_back(Eagle3Head::Row{r.seq, {token}, {0}});
        next_inputs.insert(next_inputs.end(), res.hidden.begin() + static_cast<std::ptrdiff_t>(j * h),
                           res.hidden.begin() + static_cast<std::ptrdiff_t>((j + 1) * h));
      }
      live = std::move(next);
      step_rows = std::move(next_rows);
      inputs = std::move(next_inputs);
      fused = false;
    }
    return out;
  }

  // The coupled draw of draft `step`: the target's key for its position, over the target
  // vocabulary with every token outside the draft vocabulary at zero probability.
  int32_t draw(const DraftRequestRow& ask, const Eagle3RowState& r, std::span<const float> draft_logits,
               DraftProposal& out, int step) {
    const std::span<const int32_t> to_target = head_->draft_to_target();
    const SamplingParams& params = *ask.sampling;
    if (params.selects_argmax() && !ask.want_q) {
      // The argmax over the draft vocabulary is the argmax over the scattered logits, up to ties.
      return to_target[static_cast<size_t>(argmax(draft_logits))];
    }
    full_.assign(vocab_, -std::numeric_limits<float>::infinity());
    for (size_t d = 0; d < draft_logits.size(); ++d) full_[static_cast<size_t>(to_target[d])] = draft_logits[d];
    const std::span<const int32_t> generated(out.tokens);
    const uint64_t position = static_cast<uint64_t>(ask.position) + 1 + static_cast<uint64_t>(step);
    const int32_t token = sample(full_, params, r.known, generated, position);
    if (ask.want_q) out.q.push_back(probabilities(full_, params, r.known, generated));
    return token;
  }

  std::shared_ptr<Eagle3Head> head_;
  std::string ns_;
  const Tensor* embedding_;  // the target's table, or null when the head has its own
  std::unique_ptr<KvCache> cache_;
  std::vector<Eagle3RowState> rows_;
  size_t width_ = 0;  // floats of one position's fused taps
  size_t vocab_ = 0;
  std::vector<float> staging_, full_;
};

}  // namespace

Eagle3Method::Eagle3Method(std::shared_ptr<Eagle3Head> head, std::string id, int target_layers, Eagle3Options options)
    : head_(std::move(head)), id_(std::move(id)), target_layers_(target_layers), options_(options) {
  SPECDEC_CHECK(head_ != nullptr, "no EAGLE-3 head");
  SPECDEC_CHECK(options_.num_draft >= 1, "draft depth must be at least 1, got ", options_.num_draft);
}

std::string Eagle3Method::checkpoint_namespace() const {
  return str_cat("eagle3-v1:", id_, ":", head_->config().draft_vocab);
}

TargetNeeds Eagle3Method::needs() const {
  TargetNeeds n;
  n.tap_layers = head_->config().tap_layers(target_layers_);
  n.embedding = !head_->has_embedding();
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
                                      head_->has_embedding() ? nullptr : target.embedding, blocks);
}

}  // namespace specdec
