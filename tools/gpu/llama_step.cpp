// The Llama-shaped forward used by the kernel benchmarks (see llama_step.h).
#include "llama_step.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <random>

namespace specdec::bench {
namespace {

constexpr float kEps = 1e-5f;

Tensor view(const Buffer& b, DType t, std::initializer_list<int64_t> shape) {
  Tensor v(b.data(), t, shape, b.device());
  SPECDEC_CHECK(v.bytes() <= b.bytes(), "bench: view ", v.shape_string(), " exceeds its buffer");
  return v;
}

// Fills device buffers with bf16 values in ±[0.001, 0.02] (typical initialisation scale, so 32
// layers of activations stay finite) by copying one random staging block over and over.
class Filler {
 public:
  explicit Filler(Backend& be) : be_(be) {
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> mag(0.001f, 0.02f);
    std::vector<uint16_t> host(kElems);
    for (auto& h : host) h = f32_to_bf16((rng() & 1) ? mag(rng) : -mag(rng));
    staging_ = be.allocate(kElems * 2);
    be.copy(Tensor(host.data(), DType::bf16, {kElems}), view(staging_, DType::bf16, {kElems}));
    be.synchronize();
  }
  Buffer make(int64_t elems) {
    Buffer b = be_.allocate(static_cast<size_t>(elems) * 2);
    for (int64_t done = 0; done < elems;) {
      const int64_t n = std::min<int64_t>(kElems - offset_, elems - done);
      Tensor src(static_cast<uint16_t*>(staging_.data()) + offset_, DType::bf16, {n}, Device::cuda);
      Tensor dst(static_cast<uint16_t*>(b.data()) + done, DType::bf16, {n}, Device::cuda);
      be_.copy(src, dst);
      done += n;
      offset_ = (offset_ + n) % kElems;
    }
    return b;
  }

 private:
  static constexpr int64_t kElems = int64_t{1} << 24;
  Backend& be_;
  Buffer staging_;
  int64_t offset_ = 0;
};

}  // namespace

Weights make_weights(Backend& be, const Shape& s, int pool_blocks) {
  Filler fill(be);
  Weights w;
  const int64_t h = s.hidden, qd = int64_t{s.heads} * s.head_dim, kvd = int64_t{s.kv_heads} * s.head_dim;
  const int64_t pool = int64_t{pool_blocks} * s.block_size * kvd;
  for (int l = 0; l < s.layers; ++l) {
    Weights::Layer L;
    L.ln1 = fill.make(h);
    L.ln2 = fill.make(h);
    L.q = fill.make(qd * h);
    L.k = fill.make(kvd * h);
    L.v = fill.make(kvd * h);
    L.o = fill.make(h * qd);
    L.gate = fill.make(int64_t{s.intermediate} * h);
    L.up = fill.make(int64_t{s.intermediate} * h);
    L.down = fill.make(h * s.intermediate);
    w.layers.push_back(std::move(L));
    w.k_pools.push_back(fill.make(pool));
    w.v_pools.push_back(fill.make(pool));
  }
  w.embed = fill.make(int64_t{s.vocab} * h);
  w.norm = fill.make(h);
  w.lm_head = fill.make(int64_t{s.vocab} * h);
  w.pool_blocks = pool_blocks;
  be.synchronize();
  return w;
}

StepCost decode_cost(const Shape& s, int batch, int context) {
  StepCost c;
  const double B = batch, qd = double(s.heads) * s.head_dim, kvd = double(s.kv_heads) * s.head_dim;
  c.weight_bytes = 2.0 * double(s.linear_params());
  // Each row's cache is read once per layer: K and V, bf16 (GQA heads of a group hit in cache).
  c.kv_bytes = s.layers * B * context * kvd * 2 * 2;
  // f32 activations read and written by every kernel of a layer (an estimate; small at decode).
  const double per_layer = 4.0 * (10 * s.hidden + 3 * qd + 4 * kvd + 5.0 * s.intermediate);
  c.activation_bytes = B * (s.layers * per_layer + 2.0 * 4 * s.vocab);
  c.flops = 2.0 * B * double(s.linear_params()) + 4.0 * s.layers * B * s.heads * double(context) * s.head_dim;
  return c;
}

StepCost prefill_cost(const Shape& s, int tokens) {
  StepCost c;
  const double T = tokens, kvd = double(s.kv_heads) * s.head_dim, qd = double(s.heads) * s.head_dim;
  const double layer_w = double(s.layer_params()) * s.layers, head_w = double(s.vocab) * s.hidden;
  c.weight_bytes = 2.0 * (layer_w + head_w);    // each weight once (the floor; kernels may re-read)
  c.kv_bytes = s.layers * T * kvd * 2 * 2 * 2;  // written once, read at least once
  const double per_layer = 4.0 * (10 * s.hidden + 3 * qd + 4 * kvd + 5.0 * s.intermediate);
  c.activation_bytes = T * s.layers * per_layer;
  c.flops = 2.0 * T * layer_w + 2.0 * head_w + 4.0 * s.layers * s.heads * s.head_dim * (T * (T + 1) / 2);
  return c;
}

Step::Step(Backend& be, const Shape& s, Weights& w, int rows, int tokens_per_row, int context)
    : be_(be), s_(s), w_(w), rows_(rows), tokens_(rows * tokens_per_row) {
  const int T = tokens_, bpr = (context + s.block_size - 1) / s.block_size;
  SPECDEC_CHECK(rows * bpr <= w.pool_blocks, "bench: ", rows, " rows of ", context, " positions need ", rows * bpr,
                " blocks, the pools have ", w.pool_blocks);
  std::vector<int32_t> pos, slots, starts{0}, lens, table, ids, last;
  std::mt19937 rng(99);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < tokens_per_row; ++i) {
      const int p = context - tokens_per_row + i;
      pos.push_back(p);
      slots.push_back((r * bpr + p / s.block_size) * s.block_size + p % s.block_size);
      ids.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(s.vocab)));
    }
    starts.push_back(static_cast<int32_t>(pos.size()));
    last.push_back(static_cast<int32_t>(pos.size()) - 1);
    lens.push_back(context);
    for (int b = 0; b < bpr; ++b) table.push_back(r * bpr + b);
  }
  std::vector<float> inv_freq(static_cast<size_t>(s.head_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = std::pow(500000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(s.head_dim));

  auto alloc = [&](DType t, std::initializer_list<int64_t> shape) {
    Tensor probe(nullptr, t, shape);
    owned_.push_back(be.allocate(probe.bytes()));
    return view(owned_.back(), t, shape);
  };
  auto upload = [&](const void* data, DType t, std::initializer_list<int64_t> shape) {
    Tensor d = alloc(t, shape);
    be.copy(Tensor(const_cast<void*>(data), t, shape), d);
    return d;
  };
  const int64_t h = s.hidden, qd = int64_t{s.heads} * s.head_dim, kvd = int64_t{s.kv_heads} * s.head_dim;
  batch_.positions = upload(pos.data(), DType::i32, {T});
  batch_.slots = upload(slots.data(), DType::i32, {T});
  batch_.row_starts = upload(starts.data(), DType::i32, {rows + 1});
  batch_.row_lens = upload(lens.data(), DType::i32, {rows});
  batch_.block_table = upload(table.data(), DType::i32, {rows, bpr});
  batch_.rows = rows;
  batch_.tokens = T;
  batch_.max_blocks = bpr;
  batch_.block_size = s.block_size;
  batch_.max_row_len = context;
  batch_.max_row_tokens = tokens_per_row;
  ids_ = upload(ids.data(), DType::i32, {T});
  last_idx_ = upload(last.data(), DType::i32, {rows});
  inv_freq_ = upload(inv_freq.data(), DType::f32, {s.head_dim / 2});
  x_ = alloc(DType::f32, {T, h});
  h_ = alloc(DType::f32, {T, h});
  q_ = alloc(DType::f32, {T, qd});
  k_ = alloc(DType::f32, {T, kvd});
  v_ = alloc(DType::f32, {T, kvd});
  attn_ = alloc(DType::f32, {T, qd});
  gate_ = alloc(DType::f32, {T, s.intermediate});
  last_ = alloc(DType::f32, {rows, h});
  logits_ = alloc(DType::f32, {rows, s.vocab});
  next_ = alloc(DType::i32, {rows});
  be.synchronize();
}

std::vector<Step::Op> Step::layer_ops(int l) {
  const Shape& s = s_;
  const int T = tokens_;
  const int64_t h = s.hidden, qd = int64_t{s.heads} * s.head_dim, kvd = int64_t{s.kv_heads} * s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const auto& L = w_.layers[static_cast<size_t>(l)];
  const int64_t blocks = w_.pool_blocks;
  const Tensor kp =
      view(w_.k_pools[static_cast<size_t>(l)], DType::bf16, {blocks, s.block_size, s.kv_heads, s.head_dim});
  const Tensor vp =
      view(w_.v_pools[static_cast<size_t>(l)], DType::bf16, {blocks, s.block_size, s.kv_heads, s.head_dim});
  const Tensor q3 = q_.reshape({T, s.heads, s.head_dim});
  const Tensor k3 = k_.reshape({T, s.kv_heads, s.head_dim});
  const Tensor v3 = v_.reshape({T, s.kv_heads, s.head_dim});
  const Tensor a3 = attn_.reshape({T, s.heads, s.head_dim});
  const Tensor ln1 = view(L.ln1, DType::bf16, {h}), ln2 = view(L.ln2, DType::bf16, {h});
  const Weight wq(view(L.q, DType::bf16, {qd, h})), wk(view(L.k, DType::bf16, {kvd, h}));
  const Weight wv(view(L.v, DType::bf16, {kvd, h})), wo(view(L.o, DType::bf16, {h, qd}));
  const Weight wg(view(L.gate, DType::bf16, {s.intermediate, h})), wu(view(L.up, DType::bf16, {s.intermediate, h}));
  const Weight wd(view(L.down, DType::bf16, {h, s.intermediate}));
  Backend& b = be_;
  return {
      {"rms_norm + linear qkv",
       [=, this, &b] {
         const std::array<Projection, 3> qkv = {Projection{wq, {}, q_}, Projection{wk, {}, k_}, Projection{wv, {}, v_}};
         b.norm_linear_many(x_, ln1, kEps, h_, qkv);
       }},
      {"rope+kv_write+attention",
       [=, this, &b] {
         b.rope_kv_write_attention(q3, k3, v3, batch_.positions, inv_freq_, 1.0f, kp, vp, batch_, scale, a3);
       }},
      {"linear o +x", [=, this, &b] { b.linear_add(attn_, wo, nullptr, x_); }},
      {"rms_norm + linear gate*up", [=, this, &b] { b.norm_gated_linear(x_, ln2, kEps, h_, wg, wu, gate_); }},
      {"linear down +x", [=, this, &b] { b.linear_add(gate_, wd, nullptr, x_); }},
  };
}

std::vector<Step::Op> Step::head_ops() {
  const Shape& s = s_;
  const int64_t h = s.hidden;
  const Tensor norm = view(w_.norm, DType::bf16, {h});
  const Weight head(view(w_.lm_head, DType::bf16, {s.vocab, h}));
  Backend& b = be_;
  return {
      {"gather_rows", [=, this, &b] { b.gather_rows(x_, last_idx_, last_); }},
      {"rms_norm", [=, this, &b] { b.rms_norm(last_, norm, kEps, last_); }},
      {"lm_head", [=, this, &b] { b.linear(last_, head, nullptr, logits_); }},
      {"argmax", [=, this, &b] { b.argmax(logits_, next_); }},
  };
}

void Step::run() {
  be_.embedding(view(w_.embed, DType::bf16, {s_.vocab, s_.hidden}), ids_, x_);
  for (int l = 0; l < s_.layers; ++l)
    for (auto& op : layer_ops(l)) op.run();
  for (auto& op : head_ops()) op.run();
}

}  // namespace specdec::bench
