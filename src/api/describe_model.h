// A ModelInfo from what a loader has read: the config, the weight index and the tokenizer.
#pragma once

#include <string>

#include "model/config.h"
#include "model/weights.h"
#include "specdec/model_info.h"
#include "tokenizer/tokenizer.h"

namespace specdec {

ModelInfo describe_model(const std::string& dir, const ModelConfig& config, const WeightStore& weights,
                         const Tokenizer& tokenizer);

}  // namespace specdec
