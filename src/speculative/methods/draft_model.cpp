// DraftModelRows: per row, `known` = the tokens before its pending token, and a draft KV that
// holds a prefix of known + pending + drafts. Drafting first feeds whatever the KV lacks (the
// re-feed rule falls out of this: after a full accept the last draft was never fed, so the next
// round feeds it together with the new pending token, a width-2 input), then one token a step.
// The draft KV has a prefix cache of its own, as the target's: full blocks of known tokens are
// registered once fed, and a row that starts from nothing takes the cached blocks of its
// context first, so a request sharing a long prefix with an earlier one feeds only the rest.
#include "speculative/methods/draft_model.h"

#include <algorithm>

#include "core/error.h"
#include "model/model.h"
#include "sampling/sampling.h"
#include "speculative/methods/kv_rows.h"

namespace specdec {

namespace {

// Tokens of context a draft call feeds in one forward when it catches a row up.
constexpr int kCatchUpBlock = 512;
// The longest first-step feed that returns every position where the model replays windows.
constexpr int kWindowFeed = 16;

struct DraftRowState {
  std::vector<int32_t> known;  // tokens before the pending one
  KvCache::SeqId seq = 0;
  std::vector<int32_t> fed;  // tokens in the draft KV (a prefix of known + pending + drafts)
};

class DraftModelRows : public DraftRows {
 public:
  DraftModelRows(std::shared_ptr<Model> model, std::string ns, std::string label, int kv_blocks)
      : model_(std::move(model)), ns_(std::move(ns)), label_(std::move(label)), cache_(model_->make_cache(kv_blocks)) {}
  ~DraftModelRows() override {
    for (auto& r : rows_) cache_->release(r.seq);
  }

  int row_count() const override { return static_cast<int>(rows_.size()); }

  bool has_room(int tokens) const override {
    const int block = cache_->block_size();
    return (tokens + block) / block <= cache_->free_blocks();
  }
  size_t kv_touched_bytes() const override { return cache_->touched_bytes(); }

  PreparedChange prepare_append(std::span<const Checkpoint* const> checkpoints) override {
    auto added = std::make_shared<std::vector<DraftRowState>>();
    for (const Checkpoint* cp : checkpoints) {
      if (cp) check_checkpoint(*cp, ns_);
      DraftRowState row;
      row.seq = cache_->create();
      if (cp) row.known = cp->tokens;  // the KV is rebuilt lazily from the tokens
      added->push_back(std::move(row));
    }
    return append_on_commit(rows_, added, *cache_);
  }

  void filter_rows(std::span<const int> keep) override { keep_rows(rows_, keep, *cache_); }

  // The prompt is only recorded: the first draft() feeds it (in blocks of kCatchUpBlock), so a
  // row the depth policy never lets draft (a batch where speculation does not pay) costs no
  // draft-model prefill.
  void prefill(int row, std::span<const int32_t> tokens, const TargetContext&) override {
    auto& r = rows_.at(static_cast<size_t>(row));
    r.known.insert(r.known.end(), tokens.begin(), tokens.end());
  }

  // A failure in the draft's forward or sampling (a NaN logit) names the draft model: the same
  // message from the target's forward would send the user to the wrong checkpoint.
  std::vector<DraftProposal> draft(std::span<const DraftRequestRow> asks) override {
    return with_context(label_, [&] { return draft_rows(asks); });
  }

  std::vector<DraftProposal> draft_rows(std::span<const DraftRequestRow> asks) {
    std::vector<DraftProposal> out(asks.size());
    const int max_position = model_->config().max_position;
    std::vector<size_t> live;
    for (size_t i = 0; i < asks.size(); ++i) {
      auto& r = rows_.at(static_cast<size_t>(asks[i].row));
      // Roll the KV back to the longest prefix of what is now known, then feed the rest.
      // What the KV should hold is known + pending.
      const size_t want = r.known.size() + 1;
      auto wanted = [&](size_t j) { return j < r.known.size() ? r.known[j] : asks[i].pending; };
      size_t common = 0;
      while (common < r.fed.size() && common < want && r.fed[common] == wanted(common)) ++common;
      if (common == want) --common;  // always feed at least the pending token for its logits
      cache_->truncate(r.seq, static_cast<int>(common));
      r.fed.resize(common);
      if (static_cast<int>(want) + asks[i].depth > max_position) continue;  // no room: no drafts
      live.push_back(i);
    }
    std::vector<std::vector<int32_t>> feeds(asks.size());
    // A row whose context the draft KV cannot hold drafts nothing this round (it takes a plain
    // target step): a full draft cache pauses speculation, it never fails the round.
    std::erase_if(live, [&](size_t i) { return !catch_up(asks[i], out[i], feeds[i]); });
    // The coupled draw: draft i samples with the key the target uses at its position. Rows that
    // need nothing but their logits (and no q) are drawn by the backend, as the target's are.
    const bool on_backend = std::all_of(
        asks.begin(), asks.end(), [](const DraftRequestRow& a) { return draws_on_backend(*a.sampling, a.want_q); });
    // A first step that feeds several tokens (after a full accept the last draft and the pending
    // token; a row's catch-up after rounds it did not draft in) returns every position where the
    // model replays windows: the forward is then a window, whose shapes are recorded, where one
    // returning only its last position would run call by call. Only the last position's token
    // is read; the others cost their rows of the LM head and their draws, on the device. Not
    // where the logits come back to the host (they would be copied for nothing).
    const bool window_feeds = on_backend && model_->replays_windows();
    for (int step = 0; !live.empty(); ++step) {
      // Rows the cache cannot take one more step of stop with the drafts they have.
      std::erase_if(live, [&](size_t i) {
        const auto& r = rows_[static_cast<size_t>(asks[i].row)];
        return !cache_->reserve(r.seq, static_cast<int>(r.fed.size() + feeds[i].size()));
      });
      if (live.empty()) break;
      ForwardRequest req;
      for (size_t i : live) {
        auto& r = rows_[static_cast<size_t>(asks[i].row)];
        SequenceInput in;
        in.seq = r.seq;
        in.tokens = feeds[i];
        const int n = static_cast<int>(feeds[i].size());
        const int first = window_feeds && n <= kWindowFeed ? 0 : n - 1;
        for (int p = first; p < n; ++p) in.logits_at.push_back(p);
        if (on_backend)
          req.sampling.insert(req.sampling.end(), in.logits_at.size(),
                              sample_row(*asks[i].sampling, asks[i].key_position(step)));
        req.rows.push_back(std::move(in));
      }
      ForwardResult res = model_->forward(req, *cache_);
      std::vector<size_t> next;
      for (size_t j = 0; j < live.size(); ++j) {
        const size_t i = live[j];
        auto& r = rows_[static_cast<size_t>(asks[i].row)];
        out[i].one_off = out[i].one_off || res.one_off;
        r.fed.insert(r.fed.end(), feeds[i].begin(), feeds[i].end());
        int32_t token = 0;
        const int last = res.row_offsets[j + 1] - 1;  // the row's last returned position
        if (on_backend) {
          token = res.tokens[static_cast<size_t>(last)];
        } else {
          std::span<const float> logits(res.logits_row(last), static_cast<size_t>(res.vocab));
          const SamplingParams& params = *asks[i].sampling;
          std::span<const int32_t> generated(out[i].tokens);
          token = sample(logits, params, r.known, generated, asks[i].key_position(step));
          if (asks[i].want_q) out[i].q.push_back(probabilities(logits, params, r.known, generated));
        }
        out[i].tokens.push_back(token);
        feeds[i] = {token};
        if (static_cast<int>(out[i].tokens.size()) < asks[i].depth) next.push_back(i);
      }
      live = std::move(next);
    }
    // Register what is verified (known) only: a rollback never reaches into a registered block,
    // and the drafts past known may be rejected.
    for (const DraftRequestRow& ask : asks) {
      const auto& r = rows_[static_cast<size_t>(ask.row)];
      cache_->cache_full_blocks(r.seq, r.known);
    }
    return out;
  }

  // Feeds what the row's draft KV lacks beyond the last block (a block a forward) and leaves in
  // `feed` what the first draft step feeds: the rest of the context and the pending token.
  // False when the cache cannot hold the context.
  bool catch_up(const DraftRequestRow& ask, DraftProposal& out, std::vector<int32_t>& feed) {
    auto& r = rows_.at(static_cast<size_t>(ask.row));
    if (r.fed.empty()) {  // an empty sequence: start past the cached blocks of the context
      const int covered = cache_->share_prefix(r.seq, r.known);
      r.fed.assign(r.known.begin(), r.known.begin() + covered);
    }
    while (r.known.size() - r.fed.size() > static_cast<size_t>(kCatchUpBlock)) {
      if (!cache_->reserve(r.seq, static_cast<int>(r.fed.size()) + kCatchUpBlock)) return false;
      SequenceInput in;
      in.seq = r.seq;
      in.tokens.assign(r.known.begin() + static_cast<std::ptrdiff_t>(r.fed.size()),
                       r.known.begin() + static_cast<std::ptrdiff_t>(r.fed.size()) + kCatchUpBlock);
      model_->forward(ForwardRequest{{in}, {}}, *cache_);
      r.fed.insert(r.fed.end(), in.tokens.begin(), in.tokens.end());
      out.caught_up += kCatchUpBlock;
      cache_->cache_full_blocks(r.seq, r.known);
    }
    feed.assign(r.known.begin() + static_cast<std::ptrdiff_t>(r.fed.size()), r.known.end());
    feed.push_back(ask.pending);
    // A round feeds the pending token, and after a full accept the last draft before it.
    out.caught_up += std::max(0, static_cast<int>(feed.size()) - 2);
    return true;
  }

  void commit(std::span<const RowCommit> commits) override {
    for (const RowCommit& c : commits) {
      auto& r = rows_.at(static_cast<size_t>(c.row));
      r.known.push_back(c.pending);
      r.known.insert(r.known.end(), c.emitted.begin(), c.emitted.end() - 1);
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

 private:
  std::shared_ptr<Model> model_;
  std::string ns_;
  std::string label_;  // "draft model <id>", in front of its errors
  std::unique_ptr<KvCache> cache_;
  std::vector<DraftRowState> rows_;
};

}  // namespace

DraftModelMethod::DraftModelMethod(std::shared_ptr<Model> draft, std::string id, DraftModelOptions options)
    : draft_(std::move(draft)), id_(std::move(id)), options_(options) {
  SPECDEC_CHECK(draft_ != nullptr, "no draft model");
  SPECDEC_CHECK(options_.num_draft >= 1, "draft depth must be at least 1, got ", options_.num_draft);
}

std::string DraftModelMethod::checkpoint_namespace() const {
  return str_cat("draft-model-v1:", id_, ":", draft_->config().vocab_size);
}

std::unique_ptr<DraftRows> DraftModelMethod::open(const TargetView& target) {
  const ModelConfig& c = draft_->config();
  SPECDEC_CHECK(c.vocab_size == target.vocab_size, "the draft model's vocabulary (", c.vocab_size,
                " tokens) does not match the target's (", target.vocab_size,
                "): a draft model must share the target's tokenizer");
  int blocks = options_.kv_blocks;
  if (blocks <= 0) {
    // Every row the engine runs at once, at the draft's full context, within the memory cap.
    const int rows = std::max(1, target.max_rows);
    const int by_memory = KvCache::blocks_for_memory(options_.kv_memory, c.num_layers, c.num_kv_heads, c.head_dim,
                                                     draft_->backend().kv_dtype());
    blocks = std::max(1, std::min(rows * ((c.max_position + 15) / 16 + 1), by_memory));
  }
  return std::make_unique<DraftModelRows>(draft_, checkpoint_namespace(), "draft model " + id_, blocks);
}

}  // namespace specdec
