// The rotary-embedding part of config.json: classic (rope_theta + rope_scaling) and
// transformers-5 (rope_parameters) layouts, parsed into RopeConfig.
#pragma once

#include <string>

#include "model/config.h"
#include "model/config_json.h"

namespace specdec {

// Reads the RoPE settings of a config object; unsupported rope types are refused by name.
RopeConfig parse_rope_config(const config_json::Json& config, const std::string& source);

}  // namespace specdec
