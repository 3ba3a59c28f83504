// Python semantics for template values: truth, str/repr, equality and ordering.
#include "chat/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/error.h"

namespace specdec::chat {

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

Value* Dict::find(const std::string& key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  if (Value* old = find(key)) {
    *old = std::move(v);
    return;
  }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t i, const std::string& name) const {
  if (i < positional.size()) return &positional[i];
  for (const auto& [k, v] : named)
    if (k == name) return &v;
  return nullptr;
}

Value Value::function(std::string name, std::function<Value(const CallArgs&)> f) {
  return Value(Storage(std::make_shared<Function>(Function{std::move(name), std::move(f)})));
}

Value Value::tuple(List l) {
  Value v(std::move(l));
  v.is_tuple = true;
  return v;
}

void require_defined(const Value& v) {
  if (!v.is_undefined()) return;
  const auto& why = std::get<Undefined>(v.v).name;
  throw EvalError("UndefinedError: " + (why.empty() ? std::string("value is undefined") : why));
}

int64_t Value::as_int() const {
  if (is_int()) return std::get<int64_t>(v);
  if (is_bool()) return std::get<bool>(v) ? 1 : 0;
  require_defined(*this);
  throw EvalError("expected an integer, got " + type_name());
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(v);
  if (is_int() || is_bool()) return static_cast<double>(as_int());
  require_defined(*this);
  throw EvalError("expected a number, got " + type_name());
}

bool Value::truthy() const {
  return std::visit(
      [](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, std::nullptr_t>) return false;
        else if constexpr (std::is_same_v<T, bool>) return x;
        else if constexpr (std::is_same_v<T, int64_t>) return x != 0;
        else if constexpr (std::is_same_v<T, double>) return x != 0.0;
        else if constexpr (std::is_same_v<T, std::string>) return !x.empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<List>>) return !x->empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<Dict>>) return x->is_namespace || !x->items.empty();
        else return true;
      },
      v);
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, laid out as Python's repr does: positional for exponents in
  // [-4, 16), scientific with a two-digit exponent otherwise, and always a ".0" on whole numbers.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits;
      out.append(static_cast<size_t>(exp) + 1 - digits.size(), '0');
      out += ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp) + 1);
      out += '.';
      out += digits.substr(static_cast<size_t>(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += '.', out += digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += ebuf;
  }
  if (neg) out.insert(out.begin(), '-');
  return out;
}

static std::string repr_string(const std::string& s) {
  // Python prefers single quotes unless the text has one and no double quote.
  const char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(q) || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out += static_cast<char>(c);
  }
  return out + q;
}

std::string Value::to_str() const {
  if (is_undefined()) return "";
  if (is_string()) return str();
  return repr();
}

std::string Value::repr() const {
  if (is_undefined()) return "";
  if (is_none()) return "None";
  if (is_bool()) return std::get<bool>(v) ? "True" : "False";
  if (is_int()) return std::to_string(std::get<int64_t>(v));
  if (is_float()) return format_float(std::get<double>(v));
  if (is_string()) return repr_string(str());
  if (is_list()) {
    std::string out = is_tuple ? "(" : "[";
    const List& l = list();
    for (size_t i = 0; i < l.size(); ++i) out += (i ? ", " : "") + l[i].repr();
    if (is_tuple && l.size() == 1) out += ",";
    return out + (is_tuple ? ")" : "]");
  }
  if (is_dict()) {
    const Dict& d = dict();
    std::string out = d.is_namespace ? "<Namespace {" : "{";
    for (size_t i = 0; i < d.items.size(); ++i)
      out += (i ? ", " : "") + repr_string(d.items[i].first) + ": " + d.items[i].second.repr();
    return out + (d.is_namespace ? "}>" : "}");
  }
  return "<function " + function().name + ">";
}

std::string Value::type_name() const {
  if (is_undefined()) return "Undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_list()) return is_tuple ? "tuple" : "list";
  if (is_dict()) return dict().is_namespace ? "Namespace" : "dict";
  return "function";
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.v.index() != b.v.index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) return a.str() == b.str();
  if (a.is_list()) {
    const List &x = a.list(), &y = b.list();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!equal(x[i], y[i])) return false;
    return true;
  }
  if (a.is_dict()) {
    const Dict &x = a.dict(), &y = b.dict();
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* o = y.find(k);
      if (!o || !equal(v, *o)) return false;
    }
    return true;
  }
  return &a.function() == &b.function();
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list()) {
    const List &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less(x[i], y[i])) return true;
      if (less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  require_defined(a);
  require_defined(b);
  throw EvalError("TypeError: '<' not supported between " + a.type_name() + " and " + b.type_name());
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value(nullptr);
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(from_json(e));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.items.emplace_back(k, from_json(e));
      return Value(std::move(d));
    }
    default: return Value::undefined("");
  }
}

std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace specdec::chat
