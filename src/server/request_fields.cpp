// Field readers shared by every endpoint, so that each bad field gets the same wording.
#include "server/request_fields.h"

#include <sstream>

#include "server/api_error.h"

namespace specdec::server {

namespace {

const nlohmann::json* field(const nlohmann::json& body, const std::string& name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string number_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace

std::optional<bool> read_bool(const nlohmann::json& body, const std::string& name) {
  const nlohmann::json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw invalid_field(name, "'" + name + "' must be a boolean");
  return v->get<bool>();
}

std::optional<int64_t> read_int(const nlohmann::json& body, const std::string& name, int64_t min, int64_t max) {
  const nlohmann::json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) throw invalid_field(name, "'" + name + "' must be an integer");
  // A huge unsigned value would wrap as int64_t: compare it as unsigned first.
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(max))
    throw invalid_field(name, "'" + name + "' must be at most " + std::to_string(max) + ", got " + v->dump());
  const int64_t x = v->get<int64_t>();
  if (x < min)
    throw invalid_field(name, "'" + name + "' must be at least " + std::to_string(min) + ", got " + v->dump());
  if (x > max)
    throw invalid_field(name, "'" + name + "' must be at most " + std::to_string(max) + ", got " + v->dump());
  return x;
}

std::optional<double> read_number(const nlohmann::json& body, const std::string& name, double min, double max) {
  const nlohmann::json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw invalid_field(name, "'" + name + "' must be a number");
  const double x = v->get<double>();
  if (!(x >= min && x <= max))
    throw invalid_field(
        name, "'" + name + "' must be between " + number_text(min) + " and " + number_text(max) + ", got " + v->dump());
  return x;
}

std::optional<std::string> read_string(const nlohmann::json& body, const std::string& name) {
  const nlohmann::json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw invalid_field(name, "'" + name + "' must be a string");
  return v->get<std::string>();
}

std::vector<std::string> read_stop(const nlohmann::json& body, const std::string& name) {
  const nlohmann::json* v = field(body, name);
  if (!v) return {};
  const std::string bad = "'" + name + "' must be a string or an array of strings";
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const nlohmann::json& s : *v) {
      if (!s.is_string()) throw invalid_field(name, bad);
      out.push_back(s.get<std::string>());
    }
  } else {
    throw invalid_field(name, bad);
  }
  for (const std::string& s : out)
    if (s.empty()) throw invalid_field(name, "'" + name + "' must not contain an empty string");
  return out;
}

}  // namespace specdec::server
