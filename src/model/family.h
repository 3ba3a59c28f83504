// ModelFamily: what one config.json model_type brings (its own config fields, the checkpoint
// tensors it reads, its decoder), and the registry of the families this build implements.
// Adding an architecture is a file under families/ and its line in the registry (family.cpp).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backend/backend.h"
#include "model/bound_weights.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/weights.h"

namespace specdec {

struct ModelFamily {
  std::string_view model_type;    // config.json "model_type", e.g. "qwen3"
  std::string_view architecture;  // config.json "architectures"[0], e.g. "Qwen3ForCausalLM"
  // Reads the family's own config.json fields into config (the shared ones are read already)
  // and refuses, by name, every option the family does not implement.
  void (*read_config)(const nlohmann::json& json, const std::string& source, ModelConfig& config);
  // The checkpoint tensors a model of this config reads (Hugging Face names), with their shapes.
  std::vector<WeightSpec> (*weight_specs)(const ModelConfig& config);
  // The decoder, over a checkpoint already validated against weight_specs.
  std::unique_ptr<Decoder> (*make_decoder)(const ModelConfig& config, BoundWeights& weights, Backend& backend);
};

// Every family of this build, in a table built once at first use and never changed.
std::span<const ModelFamily> model_families();
// Null when no family has that model_type / architecture.
const ModelFamily* find_family_by_type(std::string_view model_type);
const ModelFamily* find_family_by_architecture(std::string_view architecture);
// The family of a parsed config; throws naming the model_type when none implements it.
const ModelFamily& model_family(const ModelConfig& config);
// "LlamaForCausalLM (llama), ..." for messages that list what is supported.
std::string supported_families();

// The tensors a model of this config reads, as its family lists them.
std::vector<WeightSpec> weight_specs(const ModelConfig& config);

}  // namespace specdec
