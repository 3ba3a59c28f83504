// The Llama-family decoder: the embedding, then L pre-norm layers (GQA attention over the paged
// KV, SwiGLU MLP) and the final norm. All rows' tokens go through the linear layers as one
// matrix; attention is per row, over that row's cache. Pure composition of Backend kernels.
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/families/llama.h"

namespace specdec {

namespace {

// The per-token scratch of one pass (the residual stream x is the runner's).
struct LayerScratch {
  Tensor h, q, k, v, attn, gate;
  LayerScratch(Carver& a, const ModelConfig& c, int64_t T)
      : h(a.take(DType::f32, {T, c.hidden_size})),
        q(a.take(DType::f32, {T, int64_t{c.num_heads} * c.head_dim})),
        k(a.take(DType::f32, {T, int64_t{c.num_kv_heads} * c.head_dim})),
        v(a.take(DType::f32, {T, int64_t{c.num_kv_heads} * c.head_dim})),
        attn(a.take(DType::f32, {T, int64_t{c.num_heads} * c.head_dim})),
        gate(a.take(DType::f32, {T, c.intermediate_size})) {}
};

class LlamaDecoder final : public Decoder {
 public:
  LlamaDecoder(const ModelConfig& config, BoundWeights& weights, Backend& backend);

  size_t scratch_bytes(int64_t tokens) const override {
    Carver measure = Carver::measure();
    [[maybe_unused]] const LayerScratch layout(measure, config_, tokens);
    return measure.size();
  }
  void run(const DecoderPass& pass) override;
  void final_norm(const Tensor& rows) override { backend_.rms_norm(rows, final_norm_, config_.rms_norm_eps, rows); }
  const Weight& lm_head() const override { return lm_head_; }
  const Tensor& embedding_table() const override { return embed_; }

 private:
  struct Layer {
    Tensor input_norm, post_norm;
    Weight q_proj, k_proj, v_proj, o_proj;
    Tensor q_bias, k_bias, v_bias;  // empty unless config.attention_bias
    Tensor o_bias;                  // empty unless config.o_proj_bias
    Tensor q_norm, k_norm;          // empty unless config.qk_norm
    Weight gate_proj, up_proj, down_proj;
  };
  Layer bind_layer(BoundWeights& weights, int i) const;
  void attention_block(const Layer& l, int i, const DecoderPass& pass, const LayerScratch& s);

  const ModelConfig config_;
  Backend& backend_;
  Tensor embed_, final_norm_;
  Weight lm_head_;
  std::vector<Layer> layers_;
  Buffer inv_freq_buffer_;
  Tensor inv_freq_;
  float rope_scaling_ = 1.0f;
  float attn_scale_ = 1.0f;
};

LlamaDecoder::LlamaDecoder(const ModelConfig& config, BoundWeights& weights, Backend& backend)
    : config_(config), backend_(backend) {
  const ModelConfig& c = config_;
  embed_ = weights.tensor("model.embed_tokens.weight");
  final_norm_ = weights.tensor("model.norm.weight");
  lm_head_ = c.tie_word_embeddings ? weights.weight_of(embed_) : weights.weight("lm_head.weight");
  for (int i = 0; i < c.num_layers; ++i) layers_.push_back(bind_layer(weights, i));

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

LlamaDecoder::Layer LlamaDecoder::bind_layer(BoundWeights& weights, int i) const {
  const ModelConfig& c = config_;
  const std::string p = str_cat("model.layers.", i, ".");
  Layer l;
  l.input_norm = weights.tensor(p + "input_layernorm.weight");
  l.post_norm = weights.tensor(p + "post_attention_layernorm.weight");
  // Stacked where the backend keeps its own copy, so that it may run each group as one GEMM.
  std::vector<Weight> qkv =
      weights.adjacent({p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"});
  l.q_proj = qkv[0];
  l.k_proj = qkv[1];
  l.v_proj = qkv[2];
  l.o_proj = weights.weight(p + "self_attn.o_proj.weight");
  if (c.attention_bias) {
    l.q_bias = weights.tensor(p + "self_attn.q_proj.bias");
    l.k_bias = weights.tensor(p + "self_attn.k_proj.bias");
    l.v_bias = weights.tensor(p + "self_attn.v_proj.bias");
  }
  if (c.o_proj_bias) l.o_bias = weights.tensor(p + "self_attn.o_proj.bias");
  if (c.qk_norm) {
    l.q_norm = weights.tensor(p + "self_attn.q_norm.weight");
    l.k_norm = weights.tensor(p + "self_attn.k_norm.weight");
  }
  std::vector<Weight> gate_up = weights.adjacent({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"});
  l.gate_proj = gate_up[0];
  l.up_proj = gate_up[1];
  l.down_proj = weights.weight(p + "mlp.down_proj.weight");
  return l;
}

// x += o_proj(attention(rope(q, k), v)) for the normed x, with the new K/V written to the cache.
void LlamaDecoder::attention_block(const Layer& l, int i, const DecoderPass& pass, const LayerScratch& s) {
  const ModelConfig& c = config_;
  const int64_t T = pass.x.dim(0), nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim;
  const float eps = c.rms_norm_eps;
  const std::array<Projection, 3> qkv = {Projection{l.q_proj, l.q_bias, s.q}, Projection{l.k_proj, l.k_bias, s.k},
                                         Projection{l.v_proj, l.v_bias, s.v}};
  backend_.norm_linear_many(pass.x, l.input_norm, eps, s.h, qkv);
  if (!l.q_norm.empty()) {
    // Qwen3: RMSNorm over head_dim of every head, before RoPE.
    const Tensor qh = s.q.reshape({T * nh, hd});
    const Tensor kh = s.k.reshape({T * nkv, hd});
    backend_.rms_norm(qh, l.q_norm, eps, qh);
    backend_.rms_norm(kh, l.k_norm, eps, kh);
  }
  backend_.rope_kv_write_attention(s.q.reshape({T, nh, hd}), s.k.reshape({T, nkv, hd}), s.v.reshape({T, nkv, hd}),
                                   pass.batch.positions, inv_freq_, rope_scaling_, pass.cache.k_pool(i),
                                   pass.cache.v_pool(i), pass.batch, attn_scale_, s.attn.reshape({T, nh, hd}));
  backend_.linear_add(s.attn, l.o_proj, l.o_bias.empty() ? nullptr : &l.o_bias, pass.x);
}

void LlamaDecoder::run(const DecoderPass& pass) {
  Carver scratch = pass.scratch;
  const LayerScratch s(scratch, config_, pass.x.dim(0));
  backend_.embedding(embed_, pass.ids, pass.x);
  for (int i = 0; i < config_.num_layers; ++i) {
    const Layer& l = layers_[static_cast<size_t>(i)];
    attention_block(l, i, pass, s);
    backend_.norm_mlp_add(pass.x, l.post_norm, config_.rms_norm_eps, s.h, l.gate_proj, l.up_proj, s.gate, l.down_proj);
    pass.after_layer(i, pass.x);
  }
}

}  // namespace

std::unique_ptr<Decoder> make_llama_decoder(const ModelConfig& config, BoundWeights& weights, Backend& backend) {
  return std::make_unique<LlamaDecoder>(config, weights, backend);
}

}  // namespace specdec
