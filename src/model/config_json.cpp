// JSON parsing and typed field access with errors that name the file and the field.
#include "model/config_json.h"

#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace specdec::config_json {

std::string describe(const nlohmann::json::exception& e) {
  const std::string what = e.what();
  const size_t tag_end = what.find("] ");
  return tag_end == std::string::npos ? what : what.substr(tag_end + 2);
}

Json parse(const std::string& text, const std::string& source) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(source, ": invalid JSON at byte ", e.byte, ": ", describe(e));
  } catch (const nlohmann::json::out_of_range& e) {  // a number beyond double, e.g. 1e606
    fail(source, ": invalid JSON: ", describe(e));
  }
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  SPECDEC_CHECK(in.good(), path.string(), ": cannot open file");
  std::ostringstream buf;
  buf << in.rdbuf();
  SPECDEC_CHECK(!in.bad(), path.string(), ": read error");
  return buf.str();
}

Json read_file(const std::filesystem::path& path) { return parse(read_text(path), path.string()); }

namespace {

const Json* field(const Json& obj, const std::string& key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t as_int(const Json& v, const std::string& key, const std::string& source) {
  // Integral floats (e.g. 64.0) are accepted: some writers emit every number as a float.
  if (v.is_number_integer()) {
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      SPECDEC_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), source,
                    ": field \"", key, "\" = ", u, " is out of range");
      return static_cast<int64_t>(u);
    }
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // Range first: converting a double outside int64's range is undefined (found by fuzzing).
    SPECDEC_CHECK(d >= -0x1p63 && d < 0x1p63, source, ": field \"", key, "\" = ", d, " is out of range");
    SPECDEC_CHECK(d == static_cast<double>(static_cast<int64_t>(d)), source, ": field \"", key,
                  "\" must be an integer, got ", d);
    return static_cast<int64_t>(d);
  }
  fail(source, ": field \"", key, "\" must be an integer, got ", v.dump());
}

}  // namespace

std::optional<int64_t> get_int(const Json& obj, const std::string& key, const std::string& source) {
  const Json* v = field(obj, key);
  if (!v) return std::nullopt;
  return as_int(*v, key, source);
}

std::optional<double> get_number(const Json& obj, const std::string& key, const std::string& source) {
  const Json* v = field(obj, key);
  if (!v) return std::nullopt;
  SPECDEC_CHECK(v->is_number(), source, ": field \"", key, "\" must be a number, got ", v->dump());
  return v->get<double>();
}

std::optional<bool> get_bool(const Json& obj, const std::string& key, const std::string& source) {
  const Json* v = field(obj, key);
  if (!v) return std::nullopt;
  SPECDEC_CHECK(v->is_boolean(), source, ": field \"", key, "\" must be true or false, got ",
                v->dump());
  return v->get<bool>();
}

std::optional<std::string> get_string(const Json& obj, const std::string& key,
                                      const std::string& source) {
  const Json* v = field(obj, key);
  if (!v) return std::nullopt;
  SPECDEC_CHECK(v->is_string(), source, ": field \"", key, "\" must be a string, got ", v->dump());
  return v->get<std::string>();
}

std::optional<std::vector<int32_t>> get_int_list(const Json& obj, const std::string& key,
                                                 const std::string& source) {
  const Json* v = field(obj, key);
  if (!v) return std::nullopt;
  std::vector<int32_t> out;
  auto push = [&](const Json& item) {
    const int64_t id = as_int(item, key, source);
    SPECDEC_CHECK(id >= 0 && id <= std::numeric_limits<int32_t>::max(), source, ": field \"", key,
                  "\" holds token id ", id, " outside [0, 2^31)");
    out.push_back(static_cast<int32_t>(id));
  };
  if (v->is_array()) {
    for (const Json& item : *v) push(item);
  } else {
    push(*v);
  }
  return out;
}

}  // namespace specdec::config_json
