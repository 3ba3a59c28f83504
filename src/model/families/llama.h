// The Llama family: Llama, Mistral, Qwen2 (q/k/v biases) and Qwen3 (q/k norms), one pre-norm
// decoder with options (GQA attention over the paged KV, SwiGLU MLP, tied or separate LM head).
#pragma once

#include <memory>
#include <span>

#include "model/family.h"

namespace specdec {

// The registry entries: one per model_type of the family.
std::span<const ModelFamily> llama_families();

// The decoder (llama_decoder.cpp) over weights validated against the family's weight specs.
std::unique_ptr<Decoder> make_llama_decoder(const ModelConfig& config, BoundWeights& weights, Backend& backend);

}  // namespace specdec
