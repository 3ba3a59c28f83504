// Field readers for tokenizer.json components (see json_util.h).
#include "tokenizer/json_util.h"

#include "core/error.h"

namespace specdec {

std::string json_type(const nlohmann::json& spec, const std::string& where, const char* what) {
  SPECDEC_CHECK(spec.is_object(), where, ": ", what, " must be an object or null");
  auto it = spec.find("type");
  SPECDEC_CHECK(it != spec.end() && it->is_string(), where, ": ", what, " has no \"type\" string");
  return it->get<std::string>();
}

const nlohmann::json& json_array(const nlohmann::json& spec, const char* key, const std::string& where) {
  auto it = spec.find(key);
  SPECDEC_CHECK(it != spec.end() && it->is_array(), where, ": field \"", key, "\" must be an array");
  return *it;
}

std::string json_string(const nlohmann::json& spec, const char* key, const std::string& where) {
  auto it = spec.find(key);
  SPECDEC_CHECK(it != spec.end() && it->is_string(), where, ": field \"", key, "\" must be a string");
  return it->get<std::string>();
}

bool json_bool(const nlohmann::json& spec, const char* key, const std::string& where, bool fallback) {
  auto it = spec.find(key);
  if (it == spec.end() || it->is_null()) return fallback;
  SPECDEC_CHECK(it->is_boolean(), where, ": field \"", key, "\" must be a boolean");
  return it->get<bool>();
}

int64_t json_int(const nlohmann::json& spec, const char* key, const std::string& where, int64_t fallback) {
  auto it = spec.find(key);
  if (it == spec.end() || it->is_null()) return fallback;
  SPECDEC_CHECK(it->is_number_integer(), where, ": field \"", key, "\" must be an integer");
  return it->get<int64_t>();
}

Regex json_pattern(const nlohmann::json& spec, const std::string& where) {
  auto it = spec.find("pattern");
  SPECDEC_CHECK(it != spec.end() && it->is_object(), where, ": field \"pattern\" must be an object");
  if (auto s = it->find("String"); s != it->end() && s->is_string()) {
    return Regex::literal(s->get<std::string>());
  }
  if (auto r = it->find("Regex"); r != it->end() && r->is_string()) return Regex(r->get<std::string>(), where);
  fail(where, ": field \"pattern\" needs a \"String\" or \"Regex\" entry");
}

}  // namespace specdec
