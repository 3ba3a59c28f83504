// What a model folder holds: architecture, sizes, parameters and weight bytes, tokenizer facts.
// inspect_model reads it without loading the weights onto a device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace specdec {

struct SpecialToken {
  std::string text;
  int32_t id = 0;
};

struct ModelInfo {
  std::string model_dir;
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string model_type;    // "llama", "mistral", "qwen2", "qwen3"
  size_t parameter_count = 0;
  size_t weight_bytes = 0;
  std::map<std::string, size_t> parameters_by_dtype;  // e.g. {"bf16": ...}
  int num_layers = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int context_length = 0;
  std::string rope_type;
  double rope_theta = 0;
  bool tied_embedding = false;
  bool attention_bias = false;
  bool qk_norm = false;
  int vocab_size = 0;                        // the model's
  int tokenizer_vocab_size = 0;              // the tokenizer's, added tokens included
  std::vector<SpecialToken> special_tokens;  // ascending ids
  std::vector<int32_t> eos_token_ids;        // from config.json
};

// Reads config.json, the safetensors headers (validated against the architecture) and the
// tokenizer; throws std::runtime_error naming the file and the field at fault.
ModelInfo inspect_model(const std::string& model_dir);

}  // namespace specdec
