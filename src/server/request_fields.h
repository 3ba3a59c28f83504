// Typed reads of one field of a JSON request body: absent or null gives nullopt, a value of the
// wrong type or out of range throws a 400 ApiError naming the field and the bounds.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace specdec::server {

std::optional<bool> read_bool(const nlohmann::json& body, const std::string& name);
std::optional<int64_t> read_int(const nlohmann::json& body, const std::string& name, int64_t min, int64_t max);
// [min, max], both inclusive.
std::optional<double> read_number(const nlohmann::json& body, const std::string& name, double min, double max);
std::optional<std::string> read_string(const nlohmann::json& body, const std::string& name);
// A string or an array of non-empty strings.
std::vector<std::string> read_stop(const nlohmann::json& body, const std::string& name);

}  // namespace specdec::server
