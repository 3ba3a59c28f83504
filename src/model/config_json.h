// JSON reading shared by config.json, generation_config.json and safetensors headers: parse
// errors and type mismatches become specdec::Error naming the file and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace specdec::config_json {

using Json = nlohmann::json;

// Parses text; a syntax error names source and the position nlohmann reports.
Json parse(const std::string& text, const std::string& source);
// nlohmann's parse-error text without its "[json.exception...]" tag (it keeps line and column).
std::string describe(const nlohmann::json::exception& e);
// Reads and parses a file; a missing or unreadable file is an error naming it.
Json read_file(const std::filesystem::path& path);
std::string read_text(const std::filesystem::path& path);

// Typed field access on an object. Absent or null fields yield nullopt; a present field of the
// wrong type is an error naming source and the field.
std::optional<int64_t> get_int(const Json& obj, const std::string& key, const std::string& source);
std::optional<double> get_number(const Json& obj, const std::string& key, const std::string& source);
std::optional<bool> get_bool(const Json& obj, const std::string& key, const std::string& source);
std::optional<std::string> get_string(const Json& obj, const std::string& key,
                                      const std::string& source);
// An int or a list of ints (eos_token_id); absent or null: nullopt.
std::optional<std::vector<int32_t>> get_int_list(const Json& obj, const std::string& key,
                                                 const std::string& source);

}  // namespace specdec::config_json
