// tojson: Python's json.dumps layout and escaping (ensure_ascii off: only quotes, backslashes and
// control characters are escaped).
#include <algorithm>
#include <cstdio>

#include "chat/builtins.h"
#include "chat/error.h"

namespace specdec::chat {
namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

void dump(const Value& v, std::optional<int> indent, bool sort_keys, int depth, std::string& out) {
  const std::string item_sep = indent ? "," : ", ";
  auto newline = [&](int d) {
    if (!indent) return;
    out += '\n';
    out.append(static_cast<size_t>(*indent * d), ' ');
  };
  if (v.is_none()) out += "null";
  else if (v.is_bool()) out += std::get<bool>(v.v) ? "true" : "false";
  else if (v.is_int()) out += std::to_string(v.as_int());
  else if (v.is_float()) {
    const double d = v.as_double();
    out += d != d ? "NaN" : d > 1.7976931348623157e308 ? "Infinity" : d < -1.7976931348623157e308 ? "-Infinity" : format_float(d);
  } else if (v.is_string()) out += quote(v.str());
  else if (v.is_list()) {
    const List& l = v.list();
    if (l.empty()) return void(out += "[]");
    out += "[";
    for (size_t i = 0; i < l.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1);
      dump(l[i], indent, sort_keys, depth + 1, out);
    }
    newline(depth);
    out += "]";
  } else if (v.is_dict() && !v.dict().is_namespace) {
    auto items = v.dict().items;
    if (items.empty()) return void(out += "{}");
    if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.first < b.first; });
    out += "{";
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1);
      out += quote(items[i].first) + ": ";
      dump(items[i].second, indent, sort_keys, depth + 1, out);
    }
    newline(depth);
    out += "}";
  } else {
    require_defined(v);
    throw EvalError("TypeError: Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, std::optional<int> indent, bool sort_keys) {
  std::string out;
  dump(v, indent, sort_keys, 0, out);
  return out;
}

}  // namespace specdec::chat
