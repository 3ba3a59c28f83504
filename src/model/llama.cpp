// The Llama-family forward: embedding, L pre-norm decoder layers (GQA attention over the paged KV,
// SwiGLU MLP), final norm, LM head only at the returned positions. All rows' tokens go through the
// linear layers as one matrix; attention is per row, over that row's cache.
#include "model/llama.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/error.h"

namespace specdec {

namespace {

// Offsets inside scratch buffers are rounded to 256 bytes (alignment for every kernel).
size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Lays out consecutive regions of one memory block. With a null base it only measures, so the
// same code sizes a scratch buffer and then hands out views into it.
class Carver {
 public:
  Carver(void* base, size_t bytes, Device device) : base_(static_cast<char*>(base)), bytes_(bytes), device_(device) {}
  static Carver measure() { return Carver(nullptr, 0, Device::cpu); }
  Tensor take(DType dtype, std::initializer_list<int64_t> shape) {
    Tensor t(base_ ? base_ + offset_ : nullptr, dtype, shape, device_);
    offset_ += align_up(t.bytes());
    SPECDEC_CHECK(!base_ || offset_ <= bytes_, "scratch layout of ", offset_, " bytes exceeds ", bytes_);
    return t;
  }
  size_t size() const { return offset_; }

 private:
  char* base_;
  size_t bytes_;
  Device device_;
  size_t offset_ = 0;
};

Carver carve(const Buffer& b) { return Carver(b.data(), b.bytes(), b.device()); }

// The plan's i32 arrays and the output rows' SampleRows, packed so that one copy uploads them
// all (before a recorded step is replayed, too: its sample call reads them from here).
struct MetaViews {
  Tensor ids, positions, slots, row_starts, row_lens, block_table, out_index, sample_rows;
  MetaViews(Carver& m, const ForwardPlan& p)
      : ids(m.take(DType::i32, {p.tokens})),
        positions(m.take(DType::i32, {p.tokens})),
        slots(m.take(DType::i32, {p.tokens})),
        row_starts(m.take(DType::i32, {p.rows + 1})),
        row_lens(m.take(DType::i32, {p.rows})),
        block_table(m.take(DType::i32, {p.rows, p.max_blocks})),
        out_index(m.take(DType::i32, {std::max(p.outputs, 1)})),
        sample_rows(m.take(DType::i32, {std::max(p.outputs, 1), kSampleRowWords})) {}
};

// Per-token activations of one forward.
struct ActivationViews {
  Tensor x, h, q, k, v, attn, gate;
  ActivationViews(Carver& a, const ModelConfig& c, int64_t T)
      : x(a.take(DType::f32, {T, c.hidden_size})),
        h(a.take(DType::f32, {T, c.hidden_size})),
        q(a.take(DType::f32, {T, int64_t{c.num_heads} * c.head_dim})),
        k(a.take(DType::f32, {T, int64_t{c.num_kv_heads} * c.head_dim})),
        v(a.take(DType::f32, {T, int64_t{c.num_kv_heads} * c.head_dim})),
        attn(a.take(DType::f32, {T, int64_t{c.num_heads} * c.head_dim})),
        gate(a.take(DType::f32, {T, c.intermediate_size})) {}
};

// Per-output rows: the final normed hidden (LM head input), the logits, the tokens selected
// from them, and tapped hiddens.
struct OutputViews {
  Tensor final_hidden, logits, tokens;
  std::vector<Tensor> taps;
  OutputViews(Carver& o, const ModelConfig& c, int64_t N, size_t tap_count)
      : final_hidden(o.take(DType::f32, {N, c.hidden_size})),
        logits(o.take(DType::f32, {N, c.vocab_size})),
        tokens(o.take(DType::i32, {N})) {
    for (size_t j = 0; j < tap_count; ++j) taps.push_back(o.take(DType::f32, {N, c.hidden_size}));
  }
};

void put(const std::vector<int32_t>& src, const Tensor& dst) { std::copy(src.begin(), src.end(), dst.ptr<int32_t>()); }

}  // namespace

LlamaModel::LlamaModel(ModelConfig config, WeightStore store, Backend& backend)
    : config_(std::move(config)), store_(std::move(store)), backend_(backend) {
  const ModelConfig& c = config_;
  embed_ = bind("model.embed_tokens.weight");
  final_norm_ = bind("model.norm.weight");
  lm_head_ = Weight(c.tie_word_embeddings ? embed_ : bind("lm_head.weight"));
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = str_cat("model.layers.", i, ".");
    Layer& l = layers_[static_cast<size_t>(i)];
    l.input_norm = bind(p + "input_layernorm.weight");
    l.post_norm = bind(p + "post_attention_layernorm.weight");
    l.q_proj = Weight(bind(p + "self_attn.q_proj.weight"));
    l.k_proj = Weight(bind(p + "self_attn.k_proj.weight"));
    l.v_proj = Weight(bind(p + "self_attn.v_proj.weight"));
    l.o_proj = Weight(bind(p + "self_attn.o_proj.weight"));
    if (c.attention_bias) {
      l.q_bias = bind(p + "self_attn.q_proj.bias");
      l.k_bias = bind(p + "self_attn.k_proj.bias");
      l.v_bias = bind(p + "self_attn.v_proj.bias");
    }
    if (c.o_proj_bias) l.o_bias = bind(p + "self_attn.o_proj.bias");
    if (c.qk_norm) {
      l.q_norm = bind(p + "self_attn.q_norm.weight");
      l.k_norm = bind(p + "self_attn.k_norm.weight");
    }
    l.gate_proj = Weight(bind(p + "mlp.gate_proj.weight"));
    l.up_proj = Weight(bind(p + "mlp.up_proj.weight"));
    l.down_proj = Weight(bind(p + "mlp.down_proj.weight"));
  }

  const std::vector<float> inv_freq = rope_inv_freq(c);
  SPECDEC_CHECK(static_cast<int>(inv_freq.size()) * 2 == c.head_dim, "RoPE inverse frequencies (", inv_freq.size(),
                ") do not cover head_dim ", c.head_dim);
  inv_freq_buffer_ = backend_.allocate(inv_freq.size() * sizeof(float));
  inv_freq_ = inv_freq_buffer_.view(DType::f32, {static_cast<int64_t>(inv_freq.size())});
  backend_.copy(Tensor(const_cast<float*>(inv_freq.data()), DType::f32, {static_cast<int64_t>(inv_freq.size())}),
                inv_freq_);
  backend_.synchronize();  // the host vector dies at the end of this scope
  rope_scaling_ = rope_attention_scaling(c);
  attn_scale_ = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
}

size_t LlamaModel::step_weight_bytes(int tokens) const {
  if (config_.tie_word_embeddings) return weight_bytes_;  // the LM head streams the whole table
  const size_t row = embed_.bytes() / static_cast<size_t>(embed_.dim(0));
  return weight_bytes_ - embed_.bytes() + std::min(embed_.bytes(), row * static_cast<size_t>(tokens));
}

Tensor LlamaModel::bind(const std::string& name) {
  const Tensor& host = store_.get(name);
  parameter_count_ += static_cast<size_t>(host.numel());
  weight_bytes_ += host.bytes();
  if (host.device == backend_.device()) return host;  // zero copy: the backend reads host memory
  uploads_.push_back(backend_.allocate(host.bytes()));
  Tensor dev = host;
  dev.data = uploads_.back().data();
  dev.device = uploads_.back().device();
  backend_.copy(host, dev);
  return dev;
}

void LlamaModel::ensure(Buffer& buffer, size_t bytes) {
  if (buffer.bytes() >= bytes && buffer.data()) return;
  one_off_ = true;
  // Grow by half again so a slowly rising batch size reallocates rarely.
  const size_t want = std::max(bytes, buffer.bytes() + buffer.bytes() / 2);
  backend_.synchronize();  // queued kernels may still read the old buffer
  buffer = Buffer();
  buffer = backend_.allocate(want);
  recordings_.clear();  // they point into the old buffer
}

// A decode step's plan with its shape rounded up (block-table width, attention length bound),
// so that consecutive steps share one recording: the kernels read the true lengths from the
// metadata, and the larger bounds only size grids whose surplus blocks do nothing.
ForwardPlan LlamaModel::padded_for_replay(const ForwardPlan& plan) {
  ForwardPlan p = plan;
  const auto pow2 = [](int v) {
    int r = 1;
    while (r < v) r *= 2;
    return r;
  };
  p.max_row_len = pow2(std::max(plan.max_row_len, 256));
  p.max_blocks = pow2(std::max(plan.max_blocks, (p.max_row_len + plan.block_size - 1) / plan.block_size));
  p.block_table.assign(static_cast<size_t>(p.rows) * static_cast<size_t>(p.max_blocks), 0);
  for (int r = 0; r < p.rows; ++r)
    std::copy_n(plan.block_table.begin() + static_cast<ptrdiff_t>(r) * plan.max_blocks, plan.max_blocks,
                p.block_table.begin() + static_cast<ptrdiff_t>(r) * p.max_blocks);
  return p;
}

void LlamaModel::forward(const ForwardPlan& given, const std::vector<int>& tap_layers,
                         std::span<const SampleRow> sampling, KvCache& cache, ForwardResult& result) {
  // Decode steps (one token and one returned row per sequence) and one row's verify windows
  // (every new token returns its row), without taps, are replayed from a recording of their
  // calls where the backend can record; everything else runs call by call. Called one by one,
  // the bundled target's forward costs a GPU more than its replay (a step 0.19 against 0.15 ms).
  // A batch's windows come in too many shapes for recordings to pay (batch 8 with n-gram on the
  // GPU fell from 1.18-1.25x to 1.00-1.03x when they were recorded too).
  const bool one_row_window = given.rows == 1 && given.outputs == given.tokens;
  const bool decode_step = given.tokens == given.rows && given.outputs == given.rows;
  const bool replayable = backend_records_ && tap_layers.empty() && given.tokens > 0 && (decode_step || one_row_window);
  const ForwardPlan padded = replayable ? padded_for_replay(given) : ForwardPlan{};
  const ForwardPlan& plan = replayable ? padded : given;
  const ModelConfig& c = config_;
  const int64_t T = plan.tokens, N = plan.outputs;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const int64_t nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim;
  const size_t taps = tap_layers.size();
  const bool all_greedy =
      std::all_of(sampling.begin(), sampling.end(), [](const SampleRow& r) { return r.temperature == 0.0f; });
  const Selection selection =
      sampling.empty() ? Selection::logits : (all_greedy ? Selection::argmax : Selection::sample);
  const bool selects = selection != Selection::logits;

  one_off_ = false;
  // Sizes a scratch buffer for a layout (growing it if needed), then lays the views out in it.
  auto scratch = [this](Buffer& buffer, auto make) {
    Carver measure = Carver::measure();
    make(measure);
    ensure(buffer, measure.size());
    Carver in_buffer = carve(buffer);
    return make(in_buffer);
  };

  // ---- the plan's i32 arrays: laid out in a host staging vector, uploaded in one copy ----
  const auto meta_of = [&plan](Carver& m) { return MetaViews(m, plan); };
  const MetaViews meta = scratch(meta_, meta_of);
  meta_host_.assign(meta_.bytes() / sizeof(int32_t), 0);
  Carver staging(meta_host_.data(), meta_host_.size() * sizeof(int32_t), Device::cpu);
  const MetaViews host = meta_of(staging);
  put(plan.ids, host.ids);
  put(plan.positions, host.positions);
  put(plan.slots, host.slots);
  put(plan.row_starts, host.row_starts);
  put(plan.row_lens, host.row_lens);
  put(plan.block_table, host.block_table);
  put(plan.out_index, host.out_index);
  if (!sampling.empty()) std::memcpy(host.sample_rows.data, sampling.data(), sampling.size_bytes());
  const int64_t meta_elems = static_cast<int64_t>(meta_host_.size());
  backend_.copy(Tensor(meta_host_.data(), DType::i32, {meta_elems}),
                Tensor(meta_.data(), DType::i32, {meta_elems}, meta_.device()));

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

  // ---- scratch ----
  const ActivationViews act = scratch(activations_, [&](Carver& a) { return ActivationViews(a, c, T); });
  const int64_t n_alloc = std::max<int64_t>(N, 1);
  const OutputViews out = scratch(outputs_, [&](Carver& o) { return OutputViews(o, c, n_alloc, taps); });

  result.vocab = static_cast<int>(V);
  result.hidden = static_cast<int>(H);
  result.row_offsets = plan.row_offsets;
  result.logits.assign(selects ? 0 : static_cast<size_t>(N * V), 0.0f);
  result.tokens.assign(selects ? static_cast<size_t>(N) : 0, 0);
  result.taps.assign(taps, std::vector<float>(static_cast<size_t>(N * H), 0.0f));
  // Copies the hidden at the returned positions into every tap that asked for this layer.
  // `gathered`: source already holds only those rows.
  auto tap = [&](int layer, const Tensor& source, bool gathered) {
    if (N == 0) return;
    for (size_t j = 0; j < taps; ++j) {
      if (tap_layers[j] != layer) continue;
      Tensor rows = source;
      if (!gathered) {
        rows = out.taps[j].rows(0, N);
        backend_.gather_rows(source, meta.out_index.rows(0, N), rows);
      }
      backend_.copy(rows, Tensor(result.taps[j].data(), DType::f32, {N, H}));
    }
  };

  // ---- the decoder: kernel calls only (taps aside), so a decode step can be recorded ----
  const float eps = c.rms_norm_eps;
  const auto decoder = [&] {
    backend_.embedding(embed_, meta.ids, act.x);
    const Tensor q3 = act.q.reshape({T, nh, hd});
    const Tensor k3 = act.k.reshape({T, nkv, hd});
    const Tensor v3 = act.v.reshape({T, nkv, hd});
    const Tensor attn3 = act.attn.reshape({T, nh, hd});
    for (int i = 0; i < c.num_layers; ++i) {
      const Layer& l = layers_[static_cast<size_t>(i)];
      const std::array<Projection, 3> qkv = {Projection{l.q_proj, l.q_bias, act.q},
                                             Projection{l.k_proj, l.k_bias, act.k},
                                             Projection{l.v_proj, l.v_bias, act.v}};
      backend_.norm_linear_many(act.x, l.input_norm, eps, act.h, qkv);
      if (!l.q_norm.empty()) {
        // Qwen3: RMSNorm over head_dim of every head, before RoPE.
        const Tensor qh = act.q.reshape({T * nh, hd});
        const Tensor kh = act.k.reshape({T * nkv, hd});
        backend_.rms_norm(qh, l.q_norm, eps, qh);
        backend_.rms_norm(kh, l.k_norm, eps, kh);
      }
      backend_.rope_kv_write_attention(q3, k3, v3, meta.positions, inv_freq_, rope_scaling_, cache.k_pool(i),
                                       cache.v_pool(i), batch, attn_scale_, attn3);
      backend_.linear_add(act.attn, l.o_proj, l.o_bias.empty() ? nullptr : &l.o_bias, act.x);
      backend_.norm_gated_linear(act.x, l.post_norm, eps, act.h, l.gate_proj, l.up_proj, act.gate);
      backend_.linear_add(act.gate, l.down_proj, nullptr, act.x);
      tap(i, act.x, false);
    }

    // ---- the LM head, only at the returned positions (a row's norm does not depend on others) ----
    if (N > 0) {
      const Tensor g = out.final_hidden.rows(0, N);
      backend_.gather_rows(act.x, meta.out_index.rows(0, N), g);
      backend_.rms_norm(g, final_norm_, eps, g);
      tap(c.num_layers, g, true);
      backend_.linear(g, lm_head_, nullptr, out.logits.rows(0, N));
      if (selection == Selection::argmax) backend_.argmax(out.logits.rows(0, N), out.tokens.rows(0, N));
      if (selection == Selection::sample)
        backend_.sample(out.logits.rows(0, N), meta.sample_rows.rows(0, N), out.tokens.rows(0, N));
    }
  };

  if (replayable) {
    ReplayKey key{plan.rows,        plan.tokens, plan.max_row_tokens,  plan.max_blocks,
                  plan.max_row_len, selection,   cache.total_blocks(), {}};
    for (int i = 0; i < c.num_layers; ++i) {
      key.pools.push_back(cache.k_pool(i).data);
      key.pools.push_back(cache.v_pool(i).data);
    }
    replay_or_run(key, decoder);
  } else {
    decoder();
  }
  result.one_off = one_off_;
  if (N > 0 && selects) {
    backend_.copy(out.tokens.rows(0, N), Tensor(result.tokens.data(), DType::i32, {N}));
  } else if (N > 0) {
    backend_.copy(out.logits.rows(0, N), Tensor(result.logits.data(), DType::f32, {N, V}));
  }
  backend_.synchronize();
  // A device backend marks the rows the host sampler would have refused with -1.
  for (size_t i = 0; i < result.tokens.size(); ++i) {
    SPECDEC_CHECK(result.tokens[i] >= 0, "sampling: returned row ", i, " has no token to draw (its logits hold a ",
                  "NaN, or no finite value at temperature ", sampling[i].temperature, ")");
  }
}

void LlamaModel::replay_or_run(const ReplayKey& key, const std::function<void()>& calls) {
  if (recordings_.size() > kMaxRecordings && !recordings_.contains(key)) recordings_.clear();
  Replay& r = recordings_[key];
  if (r.recording && r.recording->replay()) return;
  one_off_ = true;
  r.recording.reset();
  // The first step of a shape runs call by call: it creates whatever the backend makes lazily
  // (scratch, GEMM plans), which a recording must not do. Later steps record and replay. A
  // window shape (tokens > rows) records from its third run: a depth the policy tried once need
  // not pay for a recording, which costs about three forwards called one by one.
  const int eager_runs = key.tokens > key.rows ? 2 : 1;
  if (r.runs++ < eager_runs || r.unrecordable) return calls();
  try {
    r.recording = backend_.record(calls);
    // A backend that records nothing never will: later forwards skip the padding and the keys.
    if (!r.recording) backend_records_ = false;
  } catch (const Error&) {
    r.unrecordable = true;  // e.g. a buffer had to grow while recording: stay call by call
  }
  if (!r.recording || !r.recording->replay()) {
    r.recording.reset();
    r.unrecordable = true;
    calls();
  }
}

}  // namespace specdec
