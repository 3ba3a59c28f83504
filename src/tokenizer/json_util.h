// Field readers for tokenizer.json: each names the file and the field when the value is missing
// or has the wrong type, so a bad file fails with a message a user can act on.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/regex.h"

namespace specdec {

// The "type" string of a component object; `what` is e.g. "normalizer" or "decoder".
std::string json_type(const nlohmann::json& spec, const std::string& where, const char* what);
const nlohmann::json& json_array(const nlohmann::json& spec, const char* key, const std::string& where);
std::string json_string(const nlohmann::json& spec, const char* key, const std::string& where);
bool json_bool(const nlohmann::json& spec, const char* key, const std::string& where, bool fallback);
int64_t json_int(const nlohmann::json& spec, const char* key, const std::string& where, int64_t fallback);

// A "pattern" field: {"String": literal} or {"Regex": pattern}, compiled to a Regex.
Regex json_pattern(const nlohmann::json& spec, const std::string& where);

}  // namespace specdec
