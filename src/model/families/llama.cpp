// The Llama family's registry entries: how each member reads its own config.json fields (which
// attention options it has, which options it refuses) and the checkpoint tensors it reads.
#include "model/families/llama.h"

#include <array>

#include "core/error.h"
#include "model/config_json.h"

namespace specdec {

namespace {

using config_json::Json;

// Every member: a SwiGLU MLP without biases.
void read_mlp(const Json& j, const std::string& src) {
  const std::string act = config_json::get_string(j, "hidden_act", src).value_or("silu");
  SPECDEC_CHECK(act == "silu", src, ": hidden_act \"", act, "\" is not supported (only silu)");
  SPECDEC_CHECK(!config_json::get_bool(j, "mlp_bias", src).value_or(false), src,
                ": mlp_bias = true is not supported (MLP projections with biases)");
}

// The attention_bias field, read (and type-checked) by every member, also by those it does not
// change.
bool attention_bias_field(const Json& j, const std::string& src) {
  return config_json::get_bool(j, "attention_bias", src).value_or(false);
}

void refuse_qwen_sliding_window(const Json& j, const std::string& src) {
  SPECDEC_CHECK(!config_json::get_bool(j, "use_sliding_window", src).value_or(false), src,
                ": use_sliding_window = true is not supported (sliding-window attention)");
}

void read_llama(const Json& j, const std::string& src, ModelConfig& c) {
  read_mlp(j, src);
  // transformers: attention_bias puts biases on q, k, v and o_proj alike.
  c.attention_bias = c.o_proj_bias = attention_bias_field(j, src);
}

void read_mistral(const Json& j, const std::string& src, ModelConfig& c) {
  read_mlp(j, src);
  // Mistral applies its window whenever it is set; one no shorter than the context is inert.
  const auto window = config_json::get_int(j, "sliding_window", src);
  SPECDEC_CHECK(!window || *window >= c.max_position, src, ": sliding_window = ", window.value_or(0),
                " (< max_position_embeddings = ", c.max_position, ") is not supported (sliding-window attention)");
  // Mistral's projections never have biases, whatever the field says.
  attention_bias_field(j, src);
}

void read_qwen2(const Json& j, const std::string& src, ModelConfig& c) {
  read_mlp(j, src);
  refuse_qwen_sliding_window(j, src);
  // Qwen2 always has q/k/v biases and never an o_proj bias, whatever the field says.
  attention_bias_field(j, src);
  c.attention_bias = true;
}

void read_qwen3(const Json& j, const std::string& src, ModelConfig& c) {
  read_mlp(j, src);
  refuse_qwen_sliding_window(j, src);
  c.attention_bias = c.o_proj_bias = attention_bias_field(j, src);
  c.qk_norm = true;
}

std::vector<WeightSpec> llama_weight_specs(const ModelConfig& c) {
  const int64_t V = c.vocab_size, H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int64_t q_out = int64_t{c.num_heads} * hd, kv_out = int64_t{c.num_kv_heads} * hd;
  std::vector<WeightSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {V, H}, true});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    specs.push_back({p + "input_layernorm.weight", {H}, true});
    specs.push_back({p + "self_attn.q_proj.weight", {q_out, H}, true});
    specs.push_back({p + "self_attn.k_proj.weight", {kv_out, H}, true});
    specs.push_back({p + "self_attn.v_proj.weight", {kv_out, H}, true});
    specs.push_back({p + "self_attn.o_proj.weight", {H, q_out}, true});
    if (c.attention_bias) {
      specs.push_back({p + "self_attn.q_proj.bias", {q_out}, true});
      specs.push_back({p + "self_attn.k_proj.bias", {kv_out}, true});
      specs.push_back({p + "self_attn.v_proj.bias", {kv_out}, true});
    }
    if (c.o_proj_bias) specs.push_back({p + "self_attn.o_proj.bias", {H}, true});
    if (c.qk_norm) {
      specs.push_back({p + "self_attn.q_norm.weight", {hd}, true});
      specs.push_back({p + "self_attn.k_norm.weight", {hd}, true});
    }
    specs.push_back({p + "post_attention_layernorm.weight", {H}, true});
    specs.push_back({p + "mlp.gate_proj.weight", {I, H}, true});
    specs.push_back({p + "mlp.up_proj.weight", {I, H}, true});
    specs.push_back({p + "mlp.down_proj.weight", {H, I}, true});
  }
  specs.push_back({"model.norm.weight", {H}, true});
  // Tied checkpoints reuse embed_tokens; some still store lm_head, which must then fit.
  specs.push_back({"lm_head.weight", {V, H}, !c.tie_word_embeddings});
  return specs;
}

constexpr std::array<ModelFamily, 4> kEntries{{
    {"llama", "LlamaForCausalLM", read_llama, llama_weight_specs, make_llama_decoder},
    {"mistral", "MistralForCausalLM", read_mistral, llama_weight_specs, make_llama_decoder},
    {"qwen2", "Qwen2ForCausalLM", read_qwen2, llama_weight_specs, make_llama_decoder},
    {"qwen3", "Qwen3ForCausalLM", read_qwen3, llama_weight_specs, make_llama_decoder},
}};

}  // namespace

std::span<const ModelFamily> llama_families() { return kEntries; }

}  // namespace specdec
