// DflashRows: per row, the tokens before its pending one (`known`) and, in the group's paged KV,
// each drafter layer's K/V of the projected target context of the first of them; the target's
// taps of the rest wait in the backend's memory. A prefill block or a verified round only adds its
// positions' taps to the waiting ones; a draft call first projects every waiting position of its
// rows into their context (once, never recomputed: one batched pass however many rounds a row
// did not draft in), then writes the block's own K/V after the context, attends, and truncates
// them away again, so the KV always lines up with the target's accepted tokens: each of them in
// it at its own (RoPE) position, except those the target did not tap (rounds in which the depth
// policy kept the row from drafting), which the context misses.
#include "speculative/methods/dflash.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "model/replay.h"
#include "model/scratch.h"
#include "sampling/sampling.h"
#include "speculative/methods/block_repeats.h"
#include "speculative/methods/dspark.h"
#include "speculative/methods/context_lookup.h"
#include "speculative/methods/kv_rows.h"
#include "speculative/methods/pending_taps.h"

namespace specdec {

namespace {

// Waiting positions past which a commit projects them without waiting for a draft call: a row
// that drafts nothing for long holds that many positions' taps at most.
constexpr int64_t kMaxWaiting = 128;
constexpr double kRequestCalibrationRate = 0.2;  // CutCalibration's step for one request's own offsets
constexpr double kRunnerHeadStart = 0.5;  // a repeating row proposes its runner-up until the repeat was right once

struct DflashRow {
  KvCache::SeqId seq = 0;
  std::vector<int32_t> known;       // tokens before the pending one: each in the KV context, waiting, or skipped
  PendingTaps waiting;              // taps of tapped positions not projected yet, oldest first
  std::vector<int32_t> waiting_at;  // target position of each waiting one
  bool lost = false;                // the KV could not take its context: the row drafts nothing more
  int64_t skipped = 0;              // positions the target did not tap: neither in the KV nor waiting
  int64_t last_round = 0;           // positions the last commit delivered (a round's usual catch-up)
  std::vector<double> cut_logits;   // the calibration's logits of the drafts the cut last sent
  CutCalibration own_cut{kRequestCalibrationRate};  // this request's correction on top of the drafter's
  // The last block's repeating greedy rows (block_repeats.h), scored when the round is verified.
  std::vector<DraftSwap> repeats;
  ContextLookup lookup;  // the request's text's continuation of the drafts (context_lookup.h)
};

// Host arrays of one call's ragged batch, uploaded into scratch (a copy from host memory has
// read it when it returns); kept as members so that a round allocates nothing for them.
struct BatchArrays {
  std::vector<int32_t> positions, rope_positions, slots, row_starts, row_lens, table;
  int max_blocks = 1, max_row_len = 0;
};

class DflashRows final : public DraftRows {
 public:
  DflashRows(const DflashConfig& config, std::shared_ptr<const DflashWeights> weights, Backend& backend,
             const TargetView& target, std::string ns, int kv_blocks, int max_draft, bool cut, bool lookup,
             std::shared_ptr<DflashStats> stats)
      : c_(config),
        w_(std::move(weights)),
        backend_(backend),
        embed_(*target.embedding),
        lm_head_(*target.lm_head),
        ns_(std::move(ns)),
        max_draft_(max_draft),
        cut_(cut),
        lookup_(lookup),
        stats_(std::move(stats)),
        cache_(std::make_unique<KvCache>(backend, c_.num_layers, c_.num_kv_heads, c_.head_dim, kv_blocks)) {
    const ModelConfig rc = c_.rope_config();
    const std::vector<float> inv = rope_inv_freq(rc);
    SPECDEC_CHECK(static_cast<int>(inv.size()) * 2 == c_.head_dim, "DFlash: RoPE inverse frequencies (", inv.size(),
                  ") do not cover head_dim ", c_.head_dim);
    inv_freq_buffer_ = backend_.allocate(inv.size() * sizeof(float));
    inv_freq_ = inv_freq_buffer_.view(DType::f32, {static_cast<int64_t>(inv.size())});
    backend_.copy(Tensor(const_cast<float*>(inv.data()), DType::f32, {static_cast<int64_t>(inv.size())}), inv_freq_);
    rope_scaling_ = rope_attention_scaling(rc);
    attn_scale_ = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
  }
  ~DflashRows() override {
    for (auto& r : rows_) cache_->release(r.seq);
  }

  int row_count() const override { return static_cast<int>(rows_.size()); }

  bool has_room(int tokens) const override {
    const int block = cache_->block_size();
    return (tokens + c_.block_size + block) / block <= cache_->free_blocks();
  }
  size_t kv_touched_bytes() const override { return cache_->touched_bytes(); }

  PreparedChange prepare_append(std::span<const Checkpoint* const> checkpoints) override {
    auto added = std::make_shared<std::vector<DflashRow>>();
    try {
      for (const Checkpoint* cp : checkpoints) {
        if (cp) check_checkpoint(*cp, ns_);
        DflashRow row;
        row.seq = cache_->create();
        added->push_back(std::move(row));
        if (cp) restore(added->back(), *cp);
      }
    } catch (...) {
      for (auto& r : *added) cache_->release(r.seq);
      throw;
    }
    return append_on_commit(rows_, added, *cache_);
  }

  void filter_rows(std::span<const int> keep) override { keep_rows(rows_, keep, *cache_); }

  void prefill(int row, std::span<const int32_t> tokens, const TargetContext& context) override {
    auto& r = rows_.at(static_cast<size_t>(row));
    r.known.insert(r.known.end(), tokens.begin(), tokens.end());
    keep_context(r, context, static_cast<int64_t>(tokens.size()));
    r.last_round = 0;
  }

  void commit(std::span<const RowCommit> commits) override {
    for (const RowCommit& c : commits) {
      auto& r = rows_.at(static_cast<size_t>(c.row));
      r.known.push_back(c.pending);
      r.known.insert(r.known.end(), c.emitted.begin(), c.emitted.end() - 1);
      keep_context(r, c.context, 1 + static_cast<int64_t>(c.accepted));
      r.last_round = 1 + static_cast<int64_t>(c.accepted);
      // The cut's drafts verified: the accepted ones and the first rejected one, if any.
      const int tried = std::min({c.drafted, c.accepted + 1, static_cast<int>(r.cut_logits.size())});
      for (int j = 0; j < tried; ++j) {
        const double z = r.cut_logits[static_cast<size_t>(j)];
        if (std::isnan(z)) continue;  // a row the context replaced
        r.own_cut.observe(j + 1, z + calibration_.offset(j + 1), j < c.accepted);
        calibration_.observe(j + 1, z, j < c.accepted);
      }
      r.cut_logits.clear();
      stats_->scored += score_swaps(r.repeats, c, repeats_, stats_->repeat_right, stats_->runner_right);
      r.lookup.commit(c, stats_->lookup);
    }
  }

  std::vector<DraftProposal> draft(std::span<const DraftRequestRow> asks) override {
    return with_context("DFlash drafter", [&] { return draft_rows(asks); });
  }

  Checkpoint capture(int row) const override {
    const auto& r = rows_.at(static_cast<size_t>(row));
    Checkpoint cp;
    cp.ns = ns_;
    cp.tokens = r.known;
    cp.processed_tokens = static_cast<int64_t>(r.known.size());
    cp.metadata["lost"] = r.lost;
    if (r.skipped > 0) cp.metadata["skipped"] = r.skipped;
    const int n = cache_->length(r.seq);
    for (int l = 0; l < c_.num_layers; ++l) {
      cp.tensors[str_cat("k.", l)] = read_kv(cache_->k_pool(l), r.seq, n);
      cp.tensors[str_cat("v.", l)] = read_kv(cache_->v_pool(l), r.seq, n);
    }
    // The positions after the KV context are kept as their taps, to be projected when the
    // restored row drafts.
    if (!r.waiting.empty()) {
      cp.metadata["waiting"] = r.waiting.size();
      cp.metadata["waiting_at"] = r.waiting_at;
      cp.tensors["waiting_taps"] = r.waiting.read(backend_);
    }
    return cp;
  }

 private:
  int64_t kv_width() const { return int64_t{c_.num_kv_heads} * c_.head_dim; }

  Carver scratch(size_t bytes) {
    // Queued calls may still read the old buffer: a device backend frees it in stream order,
    // after them, so there is nothing to wait for. The recordings point into it: made again.
    if (scratch_.bytes() < bytes) {
      scratch_ = backend_.allocate(bytes + bytes / 2);
      catch_up_replays_.clear();
      draft_replays_.clear();
    }
    return Carver::of(scratch_);
  }

  // What makes two calls over `batch` one recording: its shape and its (padded) bounds.
  static ReplayKey key_of(const AttentionBatch& batch) {
    ReplayKey key;
    key.rows = batch.rows;
    key.tokens = batch.tokens;
    key.max_row_tokens = batch.max_row_tokens;
    key.max_blocks = batch.max_blocks;
    key.max_row_len = batch.max_row_len;
    return key;
  }

  // On a backend that records calls, a call's attention bounds rounded up as the target's decode
  // steps round theirs, so that the rounds of one block shape share a recording (the kernels read
  // the true lengths; the bounds only size grids whose surplus blocks do nothing).
  void pad_bounds(BatchArrays& a) const {
    const ReplayCache::Bounds b = ReplayCache::padded_bounds(a.max_row_len, a.max_blocks, cache_->block_size());
    const size_t rows = a.row_lens.size(), from = static_cast<size_t>(a.max_blocks),
                 to = static_cast<size_t>(b.max_blocks);
    std::vector<int32_t> table(rows * to, 0);
    for (size_t r = 0; r < rows; ++r)
      std::copy_n(a.table.begin() + static_cast<ptrdiff_t>(r * from), from,
                  table.begin() + static_cast<ptrdiff_t>(r * to));
    a.table = std::move(table);
    a.max_blocks = b.max_blocks;
    a.max_row_len = b.max_row_len;
  }

  Tensor upload(Carver& c, const std::vector<int32_t>& host) {
    const Tensor t = c.take(DType::i32, {static_cast<int64_t>(std::max<size_t>(1, host.size()))});
    if (!host.empty())
      backend_.copy(Tensor(const_cast<int32_t*>(host.data()), DType::i32, {static_cast<int64_t>(host.size())}),
                    t.rows(0, static_cast<int64_t>(host.size())));
    return t;
  }

  // Slots, tables and lengths of `seqs` for new cache positions [from[i], from[i] + count[i]);
  // attention positions are `attend_at(i, k)`, rotary positions `rope_at(i, k)`.
  template <typename AttendAt, typename RopeAt>
  void lay_out(BatchArrays& a, std::span<const KvCache::SeqId> seqs, std::span<const int> from,
               std::span<const int> count, AttendAt attend_at, RopeAt rope_at) const {
    a = BatchArrays{};
    a.row_starts.push_back(0);
    const int bs = cache_->block_size();
    for (size_t i = 0; i < seqs.size(); ++i)
      a.max_blocks = std::max(a.max_blocks, static_cast<int>(cache_->block_table(seqs[i]).size()));
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto& table = cache_->block_table(seqs[i]);
      for (int k = 0; k < count[i]; ++k) {
        const int p = from[i] + k;
        a.positions.push_back(attend_at(i, k));
        a.rope_positions.push_back(rope_at(i, k));
        a.slots.push_back(table.at(static_cast<size_t>(p / bs)) * bs + p % bs);
      }
      a.row_starts.push_back(static_cast<int32_t>(a.positions.size()));
      a.row_lens.push_back(from[i] + count[i]);
      a.max_row_len = std::max(a.max_row_len, from[i] + count[i]);
      for (int b = 0; b < a.max_blocks; ++b)
        a.table.push_back(b < static_cast<int>(table.size()) ? table[static_cast<size_t>(b)] : 0);
    }
  }

  AttentionBatch upload_batch(Carver& c, const BatchArrays& a, int max_row_tokens, Tensor* rope_positions) {
    AttentionBatch b;
    b.positions = upload(c, a.positions);
    b.slots = upload(c, a.slots);
    b.row_starts = upload(c, a.row_starts);
    b.row_lens = upload(c, a.row_lens);
    b.block_table = upload(c, a.table).rows(0, static_cast<int64_t>(a.table.size()));
    b.rows = static_cast<int>(a.row_lens.size());
    b.tokens = static_cast<int>(a.positions.size());
    b.positions = b.positions.rows(0, b.tokens);
    b.slots = b.slots.rows(0, b.tokens);
    b.row_lens = b.row_lens.rows(0, b.rows);
    b.max_blocks = a.max_blocks;
    b.block_size = cache_->block_size();
    b.max_row_len = a.max_row_len;
    b.max_row_tokens = max_row_tokens;
    *rope_positions = upload(c, a.rope_positions).rows(0, b.tokens);
    return b;
  }

  // Keeps the taps of `positions` new target positions (device copies, nothing waited for).
  void keep_context(DflashRow& r, const TargetContext& context, int64_t positions) {
    if (r.lost || positions == 0) return;
    if (context.empty()) {
      // Positions the target did not tap (the engine taps no row that its depth policy keeps from
      // drafting for a while): the context misses them. RoPE places every position at its own
      // target position, so what was before the gap and what comes after it keep their distances.
      r.skipped += positions;
      return;
    }
    SPECDEC_CHECK(context.taps.size() == w_->fc.size() && context.positions() == positions,
                  "DFlash: ", context.taps.size(), " tapped layers x ", context.positions(), " positions, expected ",
                  w_->fc.size(), " x ", positions);
    for (size_t j = 0; j < w_->fc.size(); ++j) {
      const Tensor& tap = context.taps[j];
      SPECDEC_CHECK(tap.rank == 2 && tap.dim(1) == w_->fc[j].cols(), "DFlash: tap ", j, " is ", tap.shape_string(),
                    ", expected [", positions, ", ", w_->fc[j].cols(), "]");
    }
    r.waiting.append(backend_, context);
    for (int64_t p = static_cast<int64_t>(r.known.size()) - positions; p < static_cast<int64_t>(r.known.size()); ++p)
      r.waiting_at.push_back(static_cast<int32_t>(p));
    if (r.waiting.size() > kMaxWaiting) {
      DflashRow* one = &r;
      catch_up(std::span<DflashRow* const>(&one, 1));
      r.waiting.trim(backend_, 2 * kMaxWaiting);
    }
  }

  // Projects the waiting taps of `rows` (fc per tapped layer, summed, then hidden_norm) and
  // writes every drafter layer's K (k_proj, k_norm, RoPE at the position) and V (v_proj) of them
  // after each row's cached context: one pass over all their positions. A row whose KV cannot
  // take them is lost. True when the pass paid one-off costs (it grew the scratch or was not
  // replayed on a backend that records).
  bool catch_up(std::span<DflashRow* const> rows) {
    std::vector<DflashRow*> go;
    std::vector<KvCache::SeqId> seqs;
    std::vector<int> from, count;
    for (DflashRow* r : rows) {
      const int n = static_cast<int>(r->waiting.size());
      if (n == 0 || r->lost) continue;
      const int p0 = cache_->length(r->seq);
      if (!cache_->reserve(r->seq, p0 + n)) {
        r->lost = true;  // a full drafter KV pauses this row's drafting, it never fails the round
        r->waiting.clear();
        r->waiting_at.clear();
        continue;
      }
      go.push_back(r);
      seqs.push_back(r->seq);
      from.push_back(p0);
      count.push_back(n);
    }
    if (go.empty()) return false;
    int64_t n = 0;
    for (const int k : count) n += k;
    // Where calls are recorded, the positions are padded to a power of two, so that a few
    // recordings serve every round's count: a padding position writes no K/V (slot -1).
    const bool record = catch_up_replays_.available();
    const int64_t np = record ? ReplayCache::pow2(static_cast<int>(n)) : n;
    const int64_t H = c_.hidden_size, kw = kv_width(), Ht = go.front()->waiting.width();
    const int64_t taps = static_cast<int64_t>(w_->fc.size());
    const auto layout = [&](Carver& c) {
      struct {
        Tensor ctx, k, v, tap;
      } t{c.take(DType::f32, {np, H}), c.take(DType::f32, {np, kw}), c.take(DType::f32, {np, kw}),
          c.take(DType::f32, {taps * np, Ht})};
      return t;
    };
    lay_out(
        append_arrays_, seqs, from, count, [&](size_t i, int k) { return from[i] + k; },
        [&](size_t i, int k) { return go[i]->waiting_at[static_cast<size_t>(k)]; });
    if (record) pad_bounds(append_arrays_);
    for (int64_t p = n; p < np; ++p) {
      append_arrays_.positions.push_back(0);
      append_arrays_.rope_positions.push_back(0);
      append_arrays_.slots.push_back(-1);
    }
    Carver measure = Carver::measure();
    layout(measure);
    const size_t before = scratch_.bytes();
    Carver c = scratch(measure.size() + 4096 + static_cast<size_t>(6 * np + 64) * 256 +
                       append_arrays_.table.size() * sizeof(int32_t));
    bool one_off = scratch_.bytes() != before;
    const auto t = layout(c);
    // Tap j of every row's waiting positions, one after another, in rows [j * np, j * np + n).
    for (int64_t j = 0; j < taps; ++j) {
      int64_t at = j * np;
      for (const DflashRow* r : go) {
        backend_.copy(r->waiting.tap(static_cast<int>(j), 0, r->waiting.size()), t.tap.rows(at, r->waiting.size()));
        at += r->waiting.size();
      }
    }
    Tensor rope_pos;
    const AttentionBatch batch = upload_batch(c, append_arrays_, static_cast<int>(np), &rope_pos);
    const int64_t nkv = c_.num_kv_heads, hd = c_.head_dim;
    const auto calls = [&] {
      for (int64_t j = 0; j < taps; ++j) {
        const Tensor tap = t.tap.rows(j * np, np);
        if (j == 0)
          backend_.linear(tap, w_->fc[0], nullptr, t.ctx);
        else
          backend_.linear_add(tap, w_->fc[static_cast<size_t>(j)], nullptr, t.ctx);
      }
      backend_.rms_norm(t.ctx, w_->hidden_norm, c_.rms_norm_eps, t.ctx);
      for (int l = 0; l < c_.num_layers; ++l) {
        const auto& L = w_->layers[static_cast<size_t>(l)];
        const std::array<Projection, 2> kv = {Projection{L.k_proj, {}, t.k}, Projection{L.v_proj, {}, t.v}};
        backend_.linear_many(t.ctx, kv);
        const Tensor kh = t.k.reshape({np * nkv, hd});
        backend_.rms_norm(kh, L.k_norm, c_.rms_norm_eps, kh);
        backend_.rope(t.k.reshape({np, nkv, hd}), rope_pos, inv_freq_, rope_scaling_);
        backend_.kv_write(t.k.reshape({np, nkv, hd}), t.v.reshape({np, nkv, hd}), cache_->k_pool(l), cache_->v_pool(l),
                          batch);
      }
    };
    if (record) {
      const ReplayKey key = key_of(batch);
      one_off = catch_up_replays_.replay_or_run(key, calls) || one_off;
    } else {
      calls();
    }
    // No wait: the host arrays were read when they were copied, and every later call that reads
    // this scratch or these KV blocks is queued after these.
    for (size_t i = 0; i < go.size(); ++i) {
      cache_->set_length(go[i]->seq, from[i] + count[i]);
      go[i]->waiting.clear();
      go[i]->waiting_at.clear();
    }
    return one_off;
  }

  std::vector<DraftProposal> draft_rows(std::span<const DraftRequestRow> asks) {
    std::vector<DraftProposal> out(asks.size());
    const int gamma = c_.block_size;
    std::vector<size_t> live;
    std::vector<KvCache::SeqId> seqs;
    std::vector<int> from, count, depth;
    // The rows that draft first project the positions they have been given since they last did.
    std::vector<DflashRow*> behind;
    for (size_t i = 0; i < asks.size(); ++i) {
      auto& r = rows_.at(static_cast<size_t>(asks[i].row));
      if (r.lost || asks[i].depth <= 0 || r.waiting.empty()) continue;
      out[i].caught_up = static_cast<int>(std::max<int64_t>(0, r.waiting.size() - std::max<int64_t>(1, r.last_round)));
      behind.push_back(&r);
    }
    bool one_off = catch_up(behind);
    for (size_t i = 0; i < asks.size(); ++i) {
      auto& r = rows_.at(static_cast<size_t>(asks[i].row));
      const int ctx = cache_->length(r.seq);
      // The context must be exactly the tokens before the pending one: otherwise (a row whose KV
      // filled up) the block would stand at the wrong place, so the row drafts nothing.
      // (Positions the target did not tap are missing from the context, not misplaced.)
      if (r.lost || !r.waiting.empty() || ctx + r.skipped != static_cast<int64_t>(r.known.size()) ||
          ctx + r.skipped != asks[i].position)
        continue;
      if (asks[i].position + gamma > c_.max_position || asks[i].depth <= 0) continue;
      if (!cache_->reserve(r.seq, ctx + gamma)) continue;
      live.push_back(i);
      seqs.push_back(r.seq);
      from.push_back(ctx);
      count.push_back(gamma);
      depth.push_back(std::min({asks[i].depth, gamma - 1, max_draft_}));
    }
    if (live.empty()) return out;
    const int64_t R = static_cast<int64_t>(live.size()), T = R * gamma, H = c_.hidden_size;
    const int64_t nh = c_.num_heads, nkv = c_.num_kv_heads, hd = c_.head_dim, I = c_.intermediate_size;
    const int64_t V = lm_head_.rows();
    std::vector<int32_t> ids(static_cast<size_t>(T), c_.mask_token_id), out_index;
    std::vector<int> first_out;
    // Where the block forward is recorded, every row returns all its block positions, so that
    // the rounds' depths (which the policy and the cut move from round to round) do not each
    // make a shape of their own: a shape pays a few forwards call by call before it replays,
    // and the LM head on a few more rows costs next to nothing on a device that records.
    const bool record = draft_replays_.available();
    for (int64_t i = 0; i < R; ++i) {
      ids[static_cast<size_t>(i * gamma)] = asks[live[static_cast<size_t>(i)]].pending;
      first_out.push_back(static_cast<int>(out_index.size()));
      const int returned = record ? gamma - 1 : depth[static_cast<size_t>(i)];
      for (int k = 1; k <= returned; ++k) out_index.push_back(static_cast<int32_t>(i * gamma + k));
    }
    const int64_t n_out = static_cast<int64_t>(out_index.size());
    // Every block row sees the whole block: its attention position is the block's last, while
    // RoPE rotates it at its own position.
    lay_out(
        draft_arrays_, seqs, from, count, [&](size_t i, int) { return from[i] + gamma - 1; },
        [&](size_t i, int k) { return static_cast<int>(asks[live[i]].position) + k; });
    if (record) pad_bounds(draft_arrays_);

    // What comes back to the host is one piece, `back`: each returned row's final hidden state
    // (the confidence head's input), then each one's top log-probability, then each one's token
    // when every row takes its drafts' argmax.
    auto layout = [&](Carver& c) {
      struct {
        Tensor x, h, q, k, v, attn, gate, back, logits;
      } s{c.take(DType::f32, {T, H}),        c.take(DType::f32, {T, H}),
          c.take(DType::f32, {T, nh * hd}),  c.take(DType::f32, {T, nkv * hd}),
          c.take(DType::f32, {T, nkv * hd}), c.take(DType::f32, {T, nh * hd}),
          c.take(DType::f32, {T, I}),        c.take(DType::f32, {n_out * (H + 2)}),
          c.take(DType::f32, {n_out, V})};
      return s;
    };
    // Rows whose draws read nothing but the logits take their tokens from the device (the argmax,
    // or Backend::sample at the keys the host draw would use); a row whose penalties read the
    // history, or one asked for its distributions, needs the logits on the host.
    bool device_tokens = true, argmax_only = true;
    for (const size_t a : live) {
      device_tokens = device_tokens && draws_on_backend(*asks[a].sampling, asks[a].want_q);
      argmax_only = argmax_only && asks[a].sampling->selects_argmax();
    }
    const bool device_draws = device_tokens && !argmax_only;
    // The block's K/V lies past the context and is overwritten next round; without rejection rows
    // (which read the drafts' distributions) its results only choose drafts and their number, so
    // the block may run on the backend's fast kernels.
    const bool fast = std::none_of(live.begin(), live.end(), [&](size_t a) { return asks[a].want_q; });
    // The rows the confidence cut shortens: exact-mode rows at a fixed depth. Rejection-mode draws
    // depend on how many drafts a round has, and a seeded request must reproduce whatever the
    // timing (the cut weighs measured times), so those rows keep the depth they were given; a row
    // whose depth policy chose its depth keeps it too, since that policy already priced every
    // depth against the same windows from the row's own acceptance, and a second, shorter choice
    // on top of it made the rounds shorter than either alone.
    const auto cuts_row = [&](const DraftRequestRow& a) { return cut_ && !a.want_q && !a.adaptive; };
    const bool scores = std::any_of(live.begin(), live.end(), [&](size_t a) { return cuts_row(asks[a]); });
    Carver measure = Carver::measure();
    layout(measure);
    const size_t before = scratch_.bytes();
    Carver c = scratch(measure.size() + static_cast<size_t>(8 * T + n_out + 8 * R + 64) * 4 + 16 * 256 +
                       draft_arrays_.table.size() * 4 + static_cast<size_t>(n_out * kSampleRowWords) * 4);
    one_off = one_off || scratch_.bytes() != before;
    const auto s = layout(c);
    const Tensor sel = s.back.rows(0, n_out * H).reshape({n_out, H});
    const Tensor top_logprobs = s.back.rows(n_out * H, n_out);
    Tensor tokens = s.back.rows(n_out * (H + 1), n_out);
    tokens.dtype = DType::i32;
    draft_ids_ = ids;
    const Tensor ids_t = upload(c, draft_ids_).rows(0, T);
    draft_out_index_ = out_index;
    const Tensor out_t = upload(c, draft_out_index_).rows(0, n_out);
    Tensor rope_pos;
    const AttentionBatch batch = upload_batch(c, draft_arrays_, gamma, &rope_pos);
    Tensor keys;  // each returned row's SampleRow: draft j of a row draws with the target's key at its position
    if (device_draws) {
      draw_keys_.assign(static_cast<size_t>(n_out * kSampleRowWords), 0);
      for (int64_t i = 0; i < R; ++i) {
        const DraftRequestRow& ask = asks[live[static_cast<size_t>(i)]];
        const int returned = (i + 1 < R ? first_out[static_cast<size_t>(i + 1)] : static_cast<int>(n_out)) -
                             first_out[static_cast<size_t>(i)];
        for (int j = 0; j < returned; ++j) {
          const SampleRow key = sample_row(*ask.sampling, ask.key_position(j));
          std::memcpy(draw_keys_.data() + (first_out[static_cast<size_t>(i)] + j) * kSampleRowWords, &key, sizeof key);
        }
      }
      keys = upload(c, draw_keys_).reshape({n_out, kSampleRowWords});
    }

    const float eps = c_.rms_norm_eps;
    const auto calls = [&] {
      const FastKernelScope fast_kernels(backend_, fast);
      backend_.embedding(embed_, ids_t, s.x);
      for (int l = 0; l < c_.num_layers; ++l) {
        const auto& L = w_->layers[static_cast<size_t>(l)];
        const std::array<Projection, 3> qkv = {Projection{L.q_proj, {}, s.q}, Projection{L.k_proj, {}, s.k},
                                               Projection{L.v_proj, {}, s.v}};
        backend_.norm_linear_many(s.x, L.input_norm, eps, s.h, qkv);
        backend_.rms_norm(s.q.reshape({T * nh, hd}), L.q_norm, eps, s.q.reshape({T * nh, hd}));
        backend_.rms_norm(s.k.reshape({T * nkv, hd}), L.k_norm, eps, s.k.reshape({T * nkv, hd}));
        backend_.rope(s.q.reshape({T, nh, hd}), rope_pos, inv_freq_, rope_scaling_);
        backend_.rope(s.k.reshape({T, nkv, hd}), rope_pos, inv_freq_, rope_scaling_);
        backend_.kv_write(s.k.reshape({T, nkv, hd}), s.v.reshape({T, nkv, hd}), cache_->k_pool(l), cache_->v_pool(l),
                          batch);
        backend_.attention(s.q.reshape({T, nh, hd}), cache_->k_pool(l), cache_->v_pool(l), batch, attn_scale_,
                           s.attn.reshape({T, nh, hd}));
        backend_.linear_add(s.attn, L.o_proj, nullptr, s.x);
        backend_.norm_mlp_add(s.x, L.post_norm, eps, s.h, L.gate_proj, L.up_proj, s.gate, L.down_proj);
      }
      backend_.rms_norm(s.x, w_->norm, eps, s.x);
      if (n_out > 0) {
        backend_.gather_rows(s.x, out_t, sel);
        backend_.linear(sel, lm_head_, nullptr, s.logits);
        if (device_draws) {
          backend_.sample(s.logits, keys, tokens);
        } else if (device_tokens) {
          backend_.argmax(s.logits, tokens);
        }
        if (scores) backend_.top_logprob(s.logits, top_logprobs);
      }
    };
    if (record) {
      // The block's shape: rows, the padded bounds, and how many of its rows come back.
      ReplayKey key = key_of(batch);
      key.outputs = static_cast<int>(n_out);
      key.selection = device_draws ? Selection::sample : device_tokens ? Selection::argmax : Selection::logits;
      key.fast_kernels = fast;
      key.scores = scores;
      one_off = draft_replays_.replay_or_run(key, calls) || one_off;
    } else {
      calls();
    }
    stats_->forwards += 1;
    if (record && !one_off) stats_->replayed += 1;
    const float* logits = device_tokens ? nullptr : host_view(s.logits, host_logits_);
    // The part of `back` this round reads, in one copy: hidden states and top log-probabilities
    // when the cut weighs them, tokens when the device drew them.
    const int64_t back_from = scores ? 0 : n_out * (H + 1), back_to = device_tokens ? n_out * (H + 2) : n_out * (H + 1);
    const float* back = nullptr;  // back[e] is element e of s.back, for e in [back_from, back_to)
    if (back_to > back_from) {
      if (s.back.device == Device::cpu) {
        back = s.back.ptr<float>();
      } else {
        host_back_.resize(static_cast<size_t>(back_to));
        backend_.copy(s.back.rows(back_from, back_to - back_from),
                      Tensor(host_back_.data() + back_from, DType::f32, {back_to - back_from}));
        back = host_back_.data();
      }
    }
    const float* hidden = scores ? back : nullptr;
    for (const KvCache::SeqId seq : seqs) cache_->truncate(seq, cache_->length(seq));  // the block's K/V go

    for (int64_t i = 0; i < R; ++i) {
      const size_t a = live[static_cast<size_t>(i)];
      const DraftRequestRow& ask = asks[a];
      auto& r = rows_[static_cast<size_t>(ask.row)];
      DraftProposal& p = out[a];
      const int d = depth[static_cast<size_t>(i)];
      std::vector<double> survival;
      r.cut_logits.clear();
      r.repeats.clear();
      const bool greedy = ask.sampling->selects_argmax() && !ask.want_q;
      // A sampled exact-mode row may propose any token: it is accepted where it equals the
      // target's draw, and on text that copies itself that draw follows the copy as a greedy
      // token does. A rejection-mode row's drafts must be its own draws from q.
      const bool lookup = !ask.want_q && lookup_;
      if (lookup) r.lookup.begin(r.known, ask.pending);
      int32_t previous_top = -1;  // the row before's argmax, as the drafter gave it
      double alive = 1.0;
      for (int j = 0; j < d; ++j) {
        const int64_t o = first_out[static_cast<size_t>(i)] + j;
        int32_t token = 0;
        if (device_tokens) {
          std::memcpy(&token, back + n_out * (H + 1) + o, sizeof token);
          if (token < 0) break;  // a NaN logit: no draft from here on
        } else {
          const std::span<const float> row(logits + o * V, static_cast<size_t>(V));
          const SamplingParams& params = *ask.sampling;
          // The coupled draw: draft j samples with the key the target uses at its position.
          token = sample(row, params, r.known, p.tokens, ask.key_position(j));
          if (ask.want_q) p.q.push_back(probabilities(row, params, r.known, p.tokens));
        }
        if (greedy) {
          const int32_t top = token;
          if (j > 0 && top == previous_top) {
            // The block's logits on the host: where the device drew the tokens, copied once, on
            // the first repeat of the call.
            if (!logits) logits = host_view(s.logits, host_logits_);
            const int32_t runner = runner_up(std::span<const float>(logits + o * V, static_cast<size_t>(V)), top);
            if (runner >= 0) {
              r.repeats.push_back({j, top, runner});
              if (repeats_.swap()) {
                token = runner;
                stats_->swapped += 1;
              }
            }
          }
          previous_top = top;
        }
        // The block's rows do not see each other, so a row the context replaced leaves the rows
        // after it as good as they were: each is checked in turn.
        const int32_t own = token;
        bool agreed = false;  // the text's continuation is the row's own token
        if (lookup) {
          const ContextLookup::Choice choice = r.lookup.choose(j, token, stats_->lookup);
          token = choice.token;
          agreed = choice.agreed;
        }
        p.tokens.push_back(token);
        if (hidden && cuts_row(ask)) {
          // The confidence head scores the drafter's own row: a row the context replaced survives
          // as often as the context has been right on this request, and its outcome says nothing
          // of the head's calibration (NaN: not observed).
          double z = std::numeric_limits<double>::quiet_NaN();
          if (token == own) {
            z = row_logit(j + 1, std::span<const float>(hidden + o * H, static_cast<size_t>(H)), hidden[n_out * H + o]);
            const double head = r.own_cut.probability(j + 1, z + calibration_.offset(j + 1));
            // Where the text's continuation is the same token, either being right makes it right.
            alive *= agreed ? 1.0 - (1.0 - head) * (1.0 - r.lookup.rate()) : head;
          } else {
            alive *= r.lookup.rate();
          }
          survival.push_back(alive);
          r.cut_logits.push_back(z);
        }
      }
      if (hidden && cuts_row(ask)) {
        const size_t keep = static_cast<size_t>(dspark_cut(survival, ask.window_seconds, ask.draft_seconds));
        p.tokens.resize(keep);
        if (ask.want_q) p.q.resize(keep);
        r.cut_logits.resize(std::min(keep, r.cut_logits.size()));
      } else {
        r.cut_logits.clear();  // the row's drafts were not chosen by the cut
      }
      // Past the block: a row whose block was drafted whole, asked for more, proposes the text's
      // continuation of its drafts while there is one. On text that copies itself a block's rows
      // are all accepted round after round, and the block alone would cap the round there. A
      // round at the block's depth asks for these (Coordinator::propose); they cost no call.
      const int reach = std::min(ask.depth, max_draft_);
      if (lookup && d == gamma - 1 && static_cast<int>(p.tokens.size()) == d)
        for (int j = d; j < reach; ++j) {
          const int32_t token = r.lookup.extend(stats_->lookup);
          if (token < 0) break;
          p.tokens.push_back(token);
          if (hidden && cuts_row(ask)) {
            alive *= r.lookup.rate();
            survival.push_back(alive);
            r.cut_logits.push_back(std::numeric_limits<double>::quiet_NaN());
          }
        }
      if (lookup) r.lookup.end();
      p.one_off = one_off;
      stats_->rounds += 1;
      stats_->asked += d;
      stats_->proposed += static_cast<int64_t>(p.tokens.size());
    }
    return out;
  }

  // The calibration's logit of P(block row `row` accepted | the rows before it accepted), from the
  // row's final hidden state and its top log-probability.
  double row_logit(int row, std::span<const float> hidden, float top_logprob) const {
    const DsparkHead& head = *c_.dspark;
    double score = head.bias;
    for (size_t h = 0; h < hidden.size(); ++h) score += static_cast<double>(head.weight[h]) * hidden[h];
    return dspark_row_logit(head, row, score, top_logprob);
  }

  // A host pointer to t's floats: t itself on a host backend, else a copy into `host`.
  const float* host_view(const Tensor& t, std::vector<float>& host) {
    if (t.device == Device::cpu) return t.ptr<float>();
    host.resize(static_cast<size_t>(t.numel()));
    backend_.copy(t, Tensor(host.data(), DType::f32, {t.numel()}).reshape({t.dim(0), t.dim(1)}));
    return host.data();
  }

  // The row's first n cache positions of one pool, as f32 [n, kv_heads * head_dim].
  std::vector<float> read_kv(const Tensor& pool, KvCache::SeqId seq, int n) const {
    const int bs = cache_->block_size();
    const int64_t kw = kv_width();
    const auto& table = cache_->block_table(seq);
    std::vector<float> out(static_cast<size_t>(n * kw));
    std::vector<uint16_t> half(static_cast<size_t>(bs * kw));
    std::vector<float> full(static_cast<size_t>(bs * kw));
    for (int b = 0; b * bs < n; ++b) {
      const Tensor block = pool.rows(table.at(static_cast<size_t>(b)), 1);
      const int rows = std::min(bs, n - b * bs);
      if (pool.dtype == DType::f32) {
        backend_.copy(block, Tensor(full.data(), DType::f32, {1, bs, c_.num_kv_heads, c_.head_dim}));
      } else {
        backend_.copy(block, Tensor(half.data(), pool.dtype, {1, bs, c_.num_kv_heads, c_.head_dim}));
        for (size_t e = 0; e < half.size(); ++e)
          full[e] = pool.dtype == DType::bf16 ? bf16_to_f32(half[e]) : f16_to_f32(half[e]);
      }
      std::copy(full.begin(), full.begin() + rows * kw, out.begin() + b * bs * kw);
    }
    return out;
  }

  // Rebuilds a captured row: its tokens, every layer's K/V (already rotated) into new blocks,
  // and the taps of the positions after them.
  void restore(DflashRow& r, const Checkpoint& cp) {
    r.known = cp.tokens;
    r.lost = cp.metadata.is_object() && cp.metadata.value("lost", false);
    const int64_t waiting = cp.metadata.is_object() ? cp.metadata.value("waiting", int64_t{0}) : 0;
    r.skipped = cp.metadata.is_object() ? cp.metadata.value("skipped", int64_t{0}) : 0;
    SPECDEC_CHECK(waiting >= 0 && r.skipped >= 0 && waiting + r.skipped <= static_cast<int64_t>(cp.tokens.size()),
                  "DFlash checkpoint: ", waiting, " waiting and ", r.skipped, " skipped positions of ",
                  cp.tokens.size());
    const int n = static_cast<int>(static_cast<int64_t>(cp.tokens.size()) - waiting - r.skipped);
    const int64_t kw = kv_width();
    if (waiting > 0 && !r.lost) {
      auto it = cp.tensors.find("waiting_taps");
      const int64_t taps = static_cast<int64_t>(w_->fc.size()), width = c_.target_hidden_size;
      SPECDEC_CHECK(it != cp.tensors.end() && static_cast<int64_t>(it->second.size()) == waiting * taps * width,
                    "DFlash checkpoint lacks the taps of its ", waiting, " waiting positions");
      r.waiting.restore(backend_, static_cast<int>(taps), width, it->second);
      // Without positions (no gap in the row), the waiting ones are the last.
      r.waiting_at = cp.metadata.value("waiting_at", std::vector<int32_t>{});
      if (r.waiting_at.empty())
        for (int64_t p = static_cast<int64_t>(cp.tokens.size()) - waiting; p < static_cast<int64_t>(cp.tokens.size());
             ++p)
          r.waiting_at.push_back(static_cast<int32_t>(p));
      SPECDEC_CHECK(static_cast<int64_t>(r.waiting_at.size()) == waiting, "DFlash checkpoint: ", r.waiting_at.size(),
                    " positions of ", waiting, " waiting ones");
    }
    for (int l = 0; l < c_.num_layers; ++l)
      for (const char* kind : {"k.", "v."}) {
        auto it = cp.tensors.find(str_cat(kind, l));
        SPECDEC_CHECK(it != cp.tensors.end() && static_cast<int64_t>(it->second.size()) == n * kw,
                      "DFlash checkpoint lacks the ", kind, l, " context of ", n, " positions");
      }
    if (n == 0 || r.lost) return;
    SPECDEC_CHECK(cache_->reserve(r.seq, n), "DFlash: the drafter's KV cannot take a restored row of ", n,
                  " positions");
    const std::array<KvCache::SeqId, 1> seqs{r.seq};
    const std::array<int, 1> from{0}, count{n};
    lay_out(
        append_arrays_, seqs, from, count, [](size_t, int k) { return k; }, [](size_t, int k) { return k; });
    Carver c = scratch(static_cast<size_t>(2 * n * kw) * 4 + static_cast<size_t>(6 * n + 64) * 256 + 4096);
    const Tensor k = c.take(DType::f32, {n, c_.num_kv_heads, c_.head_dim});
    const Tensor v = c.take(DType::f32, {n, c_.num_kv_heads, c_.head_dim});
    Tensor rope_pos;
    const AttentionBatch batch = upload_batch(c, append_arrays_, n, &rope_pos);
    for (int l = 0; l < c_.num_layers; ++l) {
      const std::string k_name = str_cat("k.", l), v_name = str_cat("v.", l);
      const std::vector<float>& kh = cp.tensors.at(k_name);
      const std::vector<float>& vh = cp.tensors.at(v_name);
      backend_.copy(Tensor(const_cast<float*>(kh.data()), DType::f32, {n, c_.num_kv_heads, c_.head_dim}), k);
      backend_.copy(Tensor(const_cast<float*>(vh.data()), DType::f32, {n, c_.num_kv_heads, c_.head_dim}), v);
      // The next layer's copies into k and v are queued after this write: no wait.
      backend_.kv_write(k, v, cache_->k_pool(l), cache_->v_pool(l), batch);
    }
    cache_->set_length(r.seq, n);
  }

  const DflashConfig& c_;
  std::shared_ptr<const DflashWeights> w_;
  Backend& backend_;
  Tensor embed_;
  Weight lm_head_;
  std::string ns_;
  int max_draft_;
  bool cut_;
  bool lookup_;                 // exact-mode rows may propose the context's continuation
  CutCalibration calibration_;  // the cut's calibration corrected by its rounds' outcomes
  SwapScore repeats_{kRunnerHeadStart};  // whether a greedy row that repeats the row before proposes its runner-up
  std::shared_ptr<DflashStats> stats_;
  std::unique_ptr<KvCache> cache_;
  std::vector<DflashRow> rows_;
  Buffer inv_freq_buffer_;
  Tensor inv_freq_;
  float rope_scaling_ = 1.0f;
  float attn_scale_ = 1.0f;
  Buffer scratch_;
  // Recordings of the catch-up pass and of the block forward, per shape (backends that record).
  ReplayCache catch_up_replays_{backend_}, draft_replays_{backend_};
  BatchArrays append_arrays_, draft_arrays_;
  std::vector<int32_t> draft_ids_, draft_out_index_;
  std::vector<int32_t> draw_keys_;  // a block's SampleRows when the device draws sampled rows' drafts
  std::vector<float> host_logits_, host_back_;
};

}  // namespace

DflashMethod::DflashMethod(const std::filesystem::path& dir, Backend& backend, std::string id, DflashOptions options)
    : config_(load_dflash_config(dir)),
      backend_(backend),
      id_(std::move(id)),
      options_(options),
      stats_(std::make_shared<DflashStats>()) {
  SPECDEC_CHECK(options_.num_draft >= 0, "DFlash: the draft depth must not be negative, got ", options_.num_draft);
  weights_ = std::make_shared<const DflashWeights>(load_dflash_weights(dir, config_, backend));
  config_.target_hidden_size = static_cast<int>(weights_->fc.front().cols());
}

DflashMethod::~DflashMethod() = default;

size_t DflashMethod::parameter_count() const { return weights_->parameters; }

int DflashMethod::default_depth() const {
  // With the context lookup a round may run past the block on the text's continuation, up to a
  // window of kLookupWindow tokens.
  const int all = std::max(config_.block_size - 1, options_.context_lookup ? kLookupWindow - 1 : 0);
  return options_.num_draft > 0 ? std::min(options_.num_draft, all) : all;
}

std::string DflashMethod::checkpoint_namespace() const {
  return str_cat("dflash-v1:", id_, ":", config_.block_size, ":", default_depth(), ":", cuts() ? "cut" : "fixed");
}

TargetNeeds DflashMethod::needs() const {
  TargetNeeds n;
  n.tap_layers = config_.tap_layers;
  n.embedding = true;
  n.lm_head = true;
  // The block reads only the projected context around its anchor: after a gap, its first draft
  // is accepted far less often with one tapped position before the pending token than with every
  // position, and nearly as often with the last four.
  n.resume_taps = 4;
  return n;
}

std::unique_ptr<DraftRows> DflashMethod::open(const TargetView& target) {
  const DflashConfig& c = config_;
  const std::string who = str_cat("DFlash drafter ", id_);
  SPECDEC_CHECK(target.embedding && target.lm_head, who, " needs the target's embedding and LM head");
  SPECDEC_CHECK(target.model == nullptr || &target.model->backend() == &backend_, who,
                " was loaded on another backend than the target's");
  SPECDEC_CHECK(c.vocab_size == target.vocab_size, who, " has a vocabulary of ", c.vocab_size,
                " tokens but the target's has ", target.vocab_size, ": it was trained for another target");
  SPECDEC_CHECK(c.mask_token_id < target.vocab_size, who, ": mask_token_id ", c.mask_token_id,
                " is outside the target's vocabulary of ", target.vocab_size);
  SPECDEC_CHECK(c.num_target_layers == 0 || c.num_target_layers == target.num_layers, who, " was trained for a ",
                c.num_target_layers, "-layer target; this target has ", target.num_layers, " layers");
  SPECDEC_CHECK(c.target_hidden_size == target.hidden_size, who, " reads target hidden states of ",
                c.target_hidden_size, " but the target's hidden size is ", target.hidden_size);
  SPECDEC_CHECK(target.embedding->dim(1) == c.hidden_size && target.lm_head->cols() == c.hidden_size, who,
                ": its hidden size ", c.hidden_size, " must equal the target's embedding width ",
                target.embedding->dim(1), " (the block rows are the target's token embeddings)");
  int blocks = options_.kv_blocks;
  if (blocks <= 0) {
    const int rows = std::max(1, target.max_rows);
    const int positions = std::min(c.max_position, 1 << 16);
    const int by_memory =
        KvCache::blocks_for_memory(options_.kv_memory, c.num_layers, c.num_kv_heads, c.head_dim, backend_.kv_dtype());
    blocks = std::max(4, std::min(rows * ((positions + 15) / 16 + 1), by_memory));
  }
  return std::make_unique<DflashRows>(config_, weights_, backend_, target, checkpoint_namespace(), blocks,
                                      default_depth(), cuts(), options_.context_lookup, stats_);
}

}  // namespace specdec
