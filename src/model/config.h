// ModelConfig: what a Hugging Face config.json says about a decoder model of a registered family
// (family.h), validated. Options we do not implement are refused by name, never ignored.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace specdec {

struct RopeConfig {
  std::string type = "default";  // "default", "linear" or "llama3"
  double theta = 10000.0;
  double factor = 1.0;                // linear, llama3
  double low_freq_factor = 1.0;       // llama3
  double high_freq_factor = 4.0;      // llama3
  int original_max_position = 8192;   // llama3
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string model_type;    // the family's key, e.g. "llama", "qwen3"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;           // explicit head_dim or hidden_size / num_heads
  int max_position = 0;       // max_position_embeddings
  float rms_norm_eps = 1e-6f;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  // Attention options, set by the family's config reader (families/llama.cpp for these).
  bool attention_bias = false;  // q/k/v biases (qwen2 always; llama when attention_bias)
  bool o_proj_bias = false;     // o_proj bias (llama / qwen3 when attention_bias; never qwen2)
  bool qk_norm = false;         // per-head RMSNorm of q and k (qwen3)
  DType dtype = DType::bf16;    // declared torch_dtype / dtype (informational)
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
};

// Reads and validates dir/config.json. Errors name the file and the field.
ModelConfig load_model_config(const std::filesystem::path& dir);
ModelConfig parse_model_config(const std::string& json_text, const std::string& source_name);

// RoPE inverse frequencies [head_dim / 2] after the configured scaling, as transformers computes
// them, and the attention scaling factor applied to cos/sin (1.0 for the supported types).
std::vector<float> rope_inv_freq(const ModelConfig& config);
float rope_attention_scaling(const ModelConfig& config);

// Sampling defaults from generation_config.json (absent file or field: these defaults).
struct GenerationDefaults {
  bool do_sample = false;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;  // 0 = off
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  std::vector<int32_t> eos_token_ids;  // overrides config.json's when present
};
GenerationDefaults load_generation_config(const std::filesystem::path& dir);

}  // namespace specdec
