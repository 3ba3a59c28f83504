// ModelRunner: one forward laid out and run. The plan's metadata is uploaded in one copy; the
// decoder runs over the residual stream; only the returned positions go through the final norm
// and the LM head; tokens are selected on the backend when asked, so only they come back; the
// tapped hidden states are gathered into the output buffer and handed back as views.
#include "model/runner.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/error.h"
#include "model/family.h"

namespace specdec {

// The plan's i32 arrays and the output rows' SampleRows, packed so that one copy uploads them
// all (before a recorded step is replayed, too: its sample call reads them from here).
struct ModelRunner::MetaViews {
  Tensor ids, positions, slots, row_starts, row_lens, block_table, out_index, sample_rows, tap_index, from_previous;
  MetaViews(Carver& m, const ForwardPlan& p)
      : ids(m.take(DType::i32, {p.tokens})),
        positions(m.take(DType::i32, {p.tokens})),
        slots(m.take(DType::i32, {p.tokens})),
        row_starts(m.take(DType::i32, {p.rows + 1})),
        row_lens(m.take(DType::i32, {p.rows})),
        block_table(m.take(DType::i32, {p.rows, p.max_blocks})),
        out_index(m.take(DType::i32, {std::max(p.outputs, 1)})),
        sample_rows(m.take(DType::i32, {std::max(p.outputs, 1), kSampleRowWords})),
        tap_index(m.take(DType::i32, {std::max(p.taps, 1)})),
        // Last and empty unless asked for: a step that takes no tokens from the previous forward
        // uploads no more than before.
        from_previous(m.take(DType::i32, {static_cast<int64_t>(p.from_previous.size())})) {}
};

// Per-output rows: the final normed hidden (LM head input), the logits, the tokens selected
// from them; per tap layer, the NT tapped rows.
struct ModelRunner::OutputViews {
  Tensor final_hidden, logits, tokens;
  std::vector<Tensor> taps;
  OutputViews(Carver& o, const ModelConfig& c, int64_t N, int64_t NT, size_t tap_count)
      : final_hidden(o.take(DType::f32, {N, c.hidden_size})),
        logits(o.take(DType::f32, {N, c.vocab_size})),
        tokens(o.take(DType::i32, {N})) {
    for (size_t j = 0; j < tap_count; ++j) taps.push_back(o.take(DType::f32, {NT, c.hidden_size}));
  }
};

namespace {

// Per-token activations: the residual stream, then the decoder's own scratch.
struct ActivationViews {
  Tensor x;
  Carver decoder;
  ActivationViews(Carver& a, int64_t hidden, int64_t T, size_t decoder_bytes)
      : x(a.take(DType::f32, {T, hidden})), decoder(a.region(decoder_bytes)) {}
};

void put(const std::vector<int32_t>& src, const Tensor& dst) { std::copy(src.begin(), src.end(), dst.ptr<int32_t>()); }

template <typename Views>
AttentionBatch attention_batch(const ForwardPlan& plan, const Views& meta) {
  AttentionBatch batch;
  batch.positions = meta.positions;
  batch.slots = meta.slots;
  batch.row_starts = meta.row_starts;
  batch.row_lens = meta.row_lens;
  batch.block_table = meta.block_table;
  batch.rows = plan.rows;
  batch.tokens = plan.tokens;
  batch.max_blocks = plan.max_blocks;
  batch.block_size = plan.block_size;
  batch.max_row_len = plan.max_row_len;
  batch.max_row_tokens = plan.max_row_tokens;
  return batch;
}

Selection selection_for(std::span<const SampleRow> sampling) {
  if (sampling.empty()) return Selection::logits;
  const bool all_greedy =
      std::all_of(sampling.begin(), sampling.end(), [](const SampleRow& r) { return r.temperature == 0.0f; });
  return all_greedy ? Selection::argmax : Selection::sample;
}

}  // namespace

ModelRunner::ModelRunner(ModelConfig config, WeightStore store, Backend& backend)
    : config_(std::move(config)), backend_(backend), weights_(std::move(store), backend), replays_(backend) {
  decoder_ = model_family(config_).make_decoder(config_, weights_, backend_);
}

size_t ModelRunner::step_weight_bytes(int tokens) const {
  const size_t all = weight_bytes();
  if (config_.tie_word_embeddings) return all;  // the LM head streams the whole table
  const Tensor& embed = decoder_->embedding_table();
  const size_t row = embed.bytes() / static_cast<size_t>(embed.dim(0));
  return all - embed.bytes() + std::min(embed.bytes(), row * static_cast<size_t>(tokens));
}

size_t ModelRunner::matmul_parameters() const {
  if (config_.tie_word_embeddings) return parameter_count();
  return parameter_count() - static_cast<size_t>(decoder_->embedding_table().numel());
}

template <typename Make>
auto ModelRunner::scratch(Buffer& buffer, const Make& make, size_t* laid_out) {
  Carver measure = Carver::measure();
  make(measure);
  if (laid_out) *laid_out = measure.size();
  ensure(buffer, measure.size());
  Carver in_buffer = Carver::of(buffer);
  return make(in_buffer);
}

void ModelRunner::ensure(Buffer& buffer, size_t bytes) {
  if (buffer.bytes() >= bytes && buffer.data()) return;
  one_off_ = true;
  // Grow by half again so a slowly rising batch size reallocates rarely.
  const size_t want = std::max(bytes, buffer.bytes() + buffer.bytes() / 2);
  backend_.synchronize();  // queued kernels may still read the old buffer
  buffer = Buffer();
  buffer = backend_.allocate(want);
  replays_.clear();  // they point into the old buffer
}

void ModelRunner::reserve_for_windows(int max_blocks, size_t tap_count) {
  // Buffers only grow, so a reservation holds until a forward needs more blocks or taps.
  if (max_blocks <= reserved_blocks_ && tap_count <= reserved_taps_) return;
  reserved_blocks_ = std::max(reserved_blocks_, max_blocks);
  reserved_taps_ = std::max(reserved_taps_, tap_count);
  constexpr int64_t W = ReplayCache::kMaxPaddedWindowTokens;
  ForwardPlan widest;
  widest.rows = static_cast<int>(W / 2);  // the most rows whose windows pad to W tokens
  widest.tokens = widest.outputs = widest.taps = static_cast<int>(W);
  widest.from_previous.resize(static_cast<size_t>(W));
  widest.max_blocks = reserved_blocks_;
  Carver meta = Carver::measure();
  MetaViews(meta, widest);
  ensure(meta_, meta.size());
  Carver act = Carver::measure();
  ActivationViews(act, config_.hidden_size, W, decoder_->scratch_bytes(W));
  ensure(activations_, act.size());
  Carver out = Carver::measure();
  OutputViews(out, config_, W, W, reserved_taps_);
  ensure(outputs_, out.size());
}

ModelRunner::MetaViews ModelRunner::upload_meta(const ForwardPlan& plan, std::span<const SampleRow> sampling) {
  const auto meta_of = [&plan](Carver& m) { return MetaViews(m, plan); };
  size_t laid_out = 0;
  const MetaViews meta = scratch(meta_, meta_of, &laid_out);
  // Laid out in a host staging vector exactly as in meta_, then uploaded in one copy: only the
  // bytes this plan's layout takes, not the whole buffer, which keeps the size of the largest
  // plan seen (a prefill of many rows) and would cost every later decode step its copy.
  meta_host_.assign(laid_out / sizeof(int32_t), 0);
  Carver staging(meta_host_.data(), meta_host_.size() * sizeof(int32_t), Device::cpu);
  const MetaViews host = meta_of(staging);
  put(plan.ids, host.ids);
  put(plan.positions, host.positions);
  put(plan.slots, host.slots);
  put(plan.row_starts, host.row_starts);
  put(plan.row_lens, host.row_lens);
  put(plan.block_table, host.block_table);
  put(plan.out_index, host.out_index);
  put(plan.tap_index, host.tap_index);
  put(plan.from_previous, host.from_previous);
  if (!sampling.empty()) std::memcpy(host.sample_rows.data, sampling.data(), sampling.size_bytes());
  const int64_t meta_elems = static_cast<int64_t>(meta_host_.size());
  backend_.copy(Tensor(meta_host_.data(), DType::i32, {meta_elems}),
                Tensor(meta_.data(), DType::i32, {meta_elems}, meta_.device()));
  return meta;
}

uint64_t ModelRunner::launch(const ForwardPlan& given, const std::vector<int>& tap_layers,
                             std::span<const SampleRow> sampling, KvCache& cache) {
  SPECDEC_CHECK(launched_.size() < 2, "a third forward launched while two wait for their results");
  if (!given.from_previous.empty()) {
    SPECDEC_CHECK(drawn_count_ >= 0, "a forward takes the previous forward's tokens, which drew none");
    for (size_t r = 0; r < given.from_previous.size(); ++r)
      SPECDEC_CHECK(given.from_previous[r] < drawn_count_, "forward row ", r, ": the previous forward returned ",
                    drawn_count_, " rows, not row ", given.from_previous[r]);
  }
  Launched l;
  l.ticket = ++tickets_;
  ForwardResult& result = l.result;
  // Decode steps (one token and one returned row per sequence), one row's verify windows (every
  // new token returns its row) and batches of windows are replayed from a recording of their
  // calls where the backend can record; everything else runs call by call. Called one by one, a
  // small model's forward costs a GPU several replayed steps. Windows would come in a shape per
  // depth (per combination of depths in a batch), so each row's window is padded to one of a
  // few widths (ReplayCache::padded_windows). Taps are gathered by kernel calls, so they take
  // part in the recording.
  const bool one_row_window = given.rows == 1 && given.outputs == given.tokens;
  const bool decode_step = given.tokens == given.rows && given.outputs == given.rows;
  const bool batch_windows = replays_.available() && ReplayCache::batch_windows(given);
  const bool replayable = replays_.available() && given.tokens > 0 && (decode_step || one_row_window || batch_windows);
  const ForwardPlan padded =
      replayable ? ReplayCache::padded(batch_windows ? ReplayCache::padded_windows(given) : given) : ForwardPlan{};
  const ForwardPlan& plan = replayable ? padded : given;
  const int64_t T = plan.tokens, N = plan.outputs, NT = plan.taps;
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  const Selection selection = selection_for(sampling);
  const bool selects = selection != Selection::logits;
  // The padding's returned rows draw as the first row does (their tokens are never read).
  if (!sampling.empty() && N > given.outputs) {
    padded_sampling_.assign(sampling.begin(), sampling.end());
    padded_sampling_.resize(static_cast<size_t>(N), sampling.front());
    sampling = padded_sampling_;
  }

  one_off_ = false;
  if (replayable && replays_.recorded()) reserve_for_windows(plan.max_blocks, tap_layers.size());
  const MetaViews meta = upload_meta(plan, sampling);
  const AttentionBatch batch = attention_batch(plan, meta);
  const size_t decoder_bytes = decoder_->scratch_bytes(T);
  const ActivationViews act = scratch(activations_, [&](Carver& a) { return ActivationViews(a, H, T, decoder_bytes); });
  const OutputViews out = scratch(outputs_, [&](Carver& o) {
    return OutputViews(o, config_, std::max<int64_t>(N, 1), std::max<int64_t>(NT, 1), tap_layers.size());
  });

  // What comes back is the given plan's: its outputs and taps are the padded plan's first ones.
  const int64_t given_n = given.outputs, given_nt = given.taps;
  result.vocab = static_cast<int>(V);
  result.hidden = static_cast<int>(H);
  result.row_offsets = given.row_offsets;
  result.logits.assign(selects ? 0 : static_cast<size_t>(given_n * V), 0.0f);
  result.tokens.assign(selects ? static_cast<size_t>(given_n) : 0, 0);
  result.tap_layers = tap_layers;
  result.tap_offsets = given.tap_offsets;
  result.taps.clear();
  for (const Tensor& t : out.taps) result.taps.push_back(t.rows(0, given_nt));
  // Gathers the residual stream at the tapped positions into every tap that asked for `layer`.
  const auto tap = [&](int layer, const Tensor& x) {
    for (size_t j = 0; j < tap_layers.size() && NT > 0; ++j)
      if (tap_layers[j] == layer) backend_.gather_rows(x, meta.tap_index.rows(0, NT), out.taps[j].rows(0, NT));
  };
  const std::function<void(int, const Tensor&)> after_layer = tap;

  // Kernel calls only, so that the forward can be recorded.
  const auto calls = [&] {
    decoder_->run(DecoderPass{meta.ids, batch, cache, act.x, act.decoder, after_layer});
    // The final normed hidden at the tapped positions (a row's norm does not depend on others).
    const int L = config_.num_layers;
    tap(L, act.x);
    for (size_t j = 0; j < tap_layers.size() && NT > 0; ++j)
      if (tap_layers[j] == L) decoder_->final_norm(out.taps[j].rows(0, NT));
    if (N == 0) return;
    // The LM head, only at the returned positions.
    const Tensor g = out.final_hidden.rows(0, N);
    backend_.gather_rows(act.x, meta.out_index.rows(0, N), g);
    decoder_->final_norm(g);
    backend_.linear(g, decoder_->lm_head(), nullptr, out.logits.rows(0, N));
    if (selection == Selection::argmax) backend_.argmax(out.logits.rows(0, N), out.tokens.rows(0, N));
    if (selection == Selection::sample)
      backend_.sample(out.logits.rows(0, N), meta.sample_rows.rows(0, N), out.tokens.rows(0, N));
  };

  // The input tokens the previous forward drew (still on the backend) over the plan's ids of
  // those rows, before the calls read them.
  if (!plan.from_previous.empty()) {
    const int64_t R = static_cast<int64_t>(plan.from_previous.size());
    backend_.gather_rows(Tensor(drawn_.data(), DType::i32, {drawn_count_}, drawn_.device()),
                         meta.from_previous.rows(0, R), meta.ids.rows(0, R));
  }
  if (replayable) {
    ReplayKey key{plan.rows,   plan.tokens, plan.max_row_tokens, plan.max_blocks,      plan.max_row_len,
                  selection,   tap_layers,  plan.taps,           cache.total_blocks(), {},
                  plan.outputs};
    for (int i = 0; i < config_.num_layers; ++i) {
      key.pools.push_back(cache.k_pool(i).data);
      key.pools.push_back(cache.v_pool(i).data);
    }
    if (replays_.replay_or_run(key, calls)) one_off_ = true;
  } else {
    calls();
  }
  result.one_off = one_off_;
  for (int64_t i = 0; i < std::min<int64_t>(given_n, std::ssize(sampling)); ++i)
    l.temperatures.push_back(sampling[static_cast<size_t>(i)].temperature);
  queue_results(out, selects, l);
  launched_.push_back(std::move(l));
  return launched_.back().ticket;
}

void ModelRunner::queue_results(const OutputViews& out, bool selects, Launched& l) {
  ForwardResult& result = l.result;
  const int64_t N = static_cast<int64_t>(selects ? result.tokens.size() : result.logits.size() / config_.vocab_size);
  drawn_count_ = -1;
  if (!selects || N == 0) {
    if (N > 0) backend_.copy(out.logits.rows(0, N), Tensor(result.logits.data(), DType::f32, {N, config_.vocab_size}));
    backend_.synchronize();
    return;
  }
  const size_t bytes = static_cast<size_t>(N) * sizeof(int32_t);
  // Kept where the next forward can read them before its own calls overwrite out.tokens. The
  // buffer is not in any recording, so growing it needs only the queued calls finished.
  if (drawn_.bytes() < bytes || !drawn_.data()) {
    const size_t want = std::max(bytes, 2 * drawn_.bytes());
    backend_.synchronize();
    drawn_ = Buffer();
    drawn_ = backend_.allocate(want);
  }
  backend_.copy(out.tokens.rows(0, N), Tensor(drawn_.data(), DType::i32, {N}, drawn_.device()));
  drawn_count_ = N;
  // Two slots: a slot is reused two launches later, after its forward has been waited for.
  l.slot = static_cast<int>(l.ticket % 2);
  Buffer& staging = staging_[l.slot];
  if (staging.bytes() < bytes || !staging.data()) staging = backend_.allocate_staging(std::max<size_t>(bytes, 1024));
  backend_.copy_to_staging(out.tokens.rows(0, N), Tensor(staging.data(), DType::i32, {N}));
  l.fence = backend_.fence();
}

ForwardResult ModelRunner::wait(uint64_t ticket) {
  SPECDEC_CHECK(!launched_.empty() && launched_.front().ticket == ticket, "forward ", ticket,
                " is not the oldest one launched and not yet waited for");
  Launched l = std::move(launched_.front());
  launched_.pop_front();
  ForwardResult& result = l.result;
  if (l.slot >= 0) {
    backend_.wait_for(l.fence);
    std::memcpy(result.tokens.data(), staging_[l.slot].data(), result.tokens.size() * sizeof(int32_t));
  }
  // A device backend marks the rows the host sampler would have refused with -1.
  for (size_t i = 0; i < result.tokens.size(); ++i) {
    SPECDEC_CHECK(result.tokens[i] >= 0, "sampling: returned row ", i, " has no token to draw (its logits hold a ",
                  "NaN, or no finite value at temperature ", l.temperatures[i], ")");
  }
  return std::move(result);
}

}  // namespace specdec
