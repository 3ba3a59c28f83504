// inspect_model and describe_model: a model folder's facts without loading it onto a device.
#include "api/describe_model.h"

#include "model/family.h"

namespace specdec {

ModelInfo describe_model(const std::string& dir, const ModelConfig& c, const WeightStore& weights,
                         const Tokenizer& tokenizer) {
  ModelInfo m;
  m.model_dir = dir;
  m.architecture = c.architecture;
  m.model_type = c.model_type;
  m.parameter_count = weights.parameter_count();
  m.weight_bytes = weights.total_bytes();
  for (const auto& [name, t] : weights.all())
    m.parameters_by_dtype[std::string(dtype_name(t.dtype))] += static_cast<size_t>(t.numel());
  m.num_layers = c.num_layers;
  m.hidden_size = c.hidden_size;
  m.intermediate_size = c.intermediate_size;
  m.num_heads = c.num_heads;
  m.num_kv_heads = c.num_kv_heads;
  m.head_dim = c.head_dim;
  m.context_length = c.max_position;
  m.rope_type = c.rope.type;
  m.rope_theta = c.rope.theta;
  m.tied_embedding = c.tie_word_embeddings;
  m.attention_bias = c.attention_bias;
  m.qk_norm = c.qk_norm;
  m.vocab_size = c.vocab_size;
  m.tokenizer_vocab_size = tokenizer.vocab_size();
  for (int32_t id : tokenizer.special_ids()) m.special_tokens.push_back({tokenizer.id_to_token(id), id});
  m.eos_token_ids = c.eos_token_ids;
  return m;
}

ModelInfo inspect_model(const std::string& model_dir) {
  const ModelConfig c = load_model_config(model_dir);
  const WeightStore weights = WeightStore::open(model_dir);
  weights.validate(weight_specs(c));
  return describe_model(model_dir, c, weights, Tokenizer::load(model_dir));
}

}  // namespace specdec
