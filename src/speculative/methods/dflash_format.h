// The DFlash drafter checkpoint as published (a Qwen3-style config.json with a dflash_config
// object, and model.safetensors with fc / hidden_norm / layers.{i} / norm), plus this project's
// optional "dspark" object in config.json (the confidence head and its calibration, which other
// loaders ignore). docs/formats.md describes the layout and where it comes from.
#pragma once

#include <array>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/weight.h"
#include "model/config.h"

namespace specdec {

// The DSpark confidence head: a raw score w·h + b over a block row's final hidden, and per block
// row k (1..block-1) a logistic calibration of [score, log of the drafter's top probability] to
// P(row k accepted | rows before it accepted).
struct DsparkHead {
  std::vector<float> weight;  // [hidden]
  float bias = 0;
  std::vector<std::array<double, 3>> calibration;  // per row: w_score, w_log_max_q, bias
};

struct DflashConfig {
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  int max_position = 0;
  float rms_norm_eps = 1e-6f;
  RopeConfig rope;
  int block_size = 0;
  int32_t mask_token_id = 0;
  int num_target_layers = 0;          // 0 when the config does not say
  std::vector<int> target_layer_ids;  // as declared (Hugging Face hidden_states index - 1)
  std::vector<int> tap_layers;        // the same layers as specdec's taps (the last one: L)
  int target_hidden_size = 0;         // from fc's width / the number of target layers
  std::optional<DsparkHead> dspark;

  // A ModelConfig carrying what the RoPE helpers read (head_dim, rope, max_position).
  ModelConfig rope_config() const;
};

// Whether dir/config.json describes a DFlash drafter (architecture DFlashDraftModel, or a
// dflash_config object). False when there is no readable config.json.
bool is_dflash_checkpoint(const std::filesystem::path& dir);

// Reads and validates dir/config.json and the shapes in dir's safetensors. Options this
// implementation does not run (sliding windows, causal blocks, DFlash2's convolutions and
// candidate selector, logit multipliers) are refused by name. Errors name the file and the field.
DflashConfig load_dflash_config(const std::filesystem::path& dir);

// The drafter's weights bound to a backend. fc is kept split by tap ([hidden, target_hidden]
// each) so that the tapped layers need no concatenation: fc(x) = Σ_j fc_j(tap_j).
struct DflashWeights {
  struct Layer {
    Tensor input_norm, post_norm, q_norm, k_norm;
    Weight q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  };
  std::vector<Weight> fc;  // one per target layer id, in declared order
  Tensor hidden_norm, norm;
  std::vector<Layer> layers;
  std::vector<Buffer> owned;  // fc's split copies and their packed layouts (and uploads on a device backend)
  size_t parameters = 0;
  std::shared_ptr<void> keep_alive;  // the checkpoint's bound tensors
};

DflashWeights load_dflash_weights(const std::filesystem::path& dir, const DflashConfig& config, Backend& backend);

}  // namespace specdec
