// Python operator semantics over Value.
#include "chat/operators.h"

#include <cmath>

#include "chat/error.h"

namespace specdec::chat {
namespace {

[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  throw EvalError("TypeError: unsupported operand types for " + op + ": '" + a.type_name() + "' and '" +
                  b.type_name() + "'");
}

Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value(std::move(out));
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  const bool floats = a.is_float() || b.is_float();
  if (op == "/") {
    if (b.as_double() == 0) throw EvalError("ZeroDivisionError: division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "**") {
    if (!floats && b.as_int() >= 0) return Value(static_cast<int64_t>(std::llround(std::pow(a.as_double(), b.as_double()))));
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  if (floats) {
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (y == 0) throw EvalError("ZeroDivisionError: float division by zero");
    if (op == "//") return Value(std::floor(x / y));
    return Value(x - y * std::floor(x / y));  // Python's %: the result takes the divisor's sign
  }
  const int64_t x = a.as_int(), y = b.as_int();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (y == 0) throw EvalError("ZeroDivisionError: integer division or modulo by zero");
  int64_t q = x / y, r = x % y;
  if (r != 0 && ((r < 0) != (y < 0))) --q, r += y;
  return Value(op == "//" ? q : r);
}

// Built with += rather than a chain of +, which GCC 12 misreads as an overlapping copy (-Wrestrict).
Value missing(const std::string& owner, const std::string& what) {
  std::string why = "'";
  why += owner;
  why += " object' has no ";
  why += what;
  return Value::undefined(why);
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value(a.to_str() + b.to_str());
  if (op == "==") return Value(equal(a, b));
  if (op == "!=") return Value(!equal(a, b));
  if (op == "<") return Value(less(a, b));
  if (op == ">") return Value(less(b, a));
  if (op == "<=") return Value(!less(b, a));
  if (op == ">=") return Value(!less(a, b));
  if (op == "in") return Value(contains(b, a));
  if (op == "not in") return Value(!contains(b, a));
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == "+" && a.is_string() && b.is_string()) return Value(a.str() + b.str());
  if (op == "+" && a.is_list() && b.is_list()) {
    List out = a.list();
    out.insert(out.end(), b.list().begin(), b.list().end());
    return Value(std::move(out));
  }
  if (op == "*" && (a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
  if (op == "*" && (b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
  type_error(op, a, b);
}

bool contains(const Value& c, const Value& item) {
  if (c.is_string()) {
    if (!item.is_string()) {
      require_defined(item);
      throw EvalError("TypeError: 'in <string>' requires string as left operand, not " + item.type_name());
    }
    return c.str().find(item.str()) != std::string::npos;
  }
  if (c.is_list()) {
    for (const Value& v : c.list())
      if (equal(v, item)) return true;
    return false;
  }
  if (c.is_dict()) return item.is_string() && c.dict().find(item.str()) != nullptr;
  if (c.is_undefined()) return false;
  throw EvalError("TypeError: argument of type '" + c.type_name() + "' is not iterable");
}

Value get_attr(const Value& object, const std::string& name) {
  require_defined(object);
  if (object.is_dict()) {
    const Dict& d = object.dict();
    if (!d.is_namespace) {
      Value m = bound_method(object, name);
      if (!m.is_undefined()) return m;
    }
    if (const Value* v = d.find(name)) return *v;
    return missing(d.is_namespace ? "Namespace" : "dict", "attribute '" + name + "'");
  }
  if (object.is_list() && !name.empty() && std::isdigit(static_cast<unsigned char>(name[0])))
    return get_item(object, Value(static_cast<int64_t>(std::stoll(name))));
  Value m = bound_method(object, name);
  if (!m.is_undefined()) return m;
  return missing(object.type_name(), "attribute '" + name + "'");
}

Value get_item(const Value& object, const Value& key) {
  require_defined(object);
  if (object.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = object.dict().find(key.str())) return *v;
      return get_attr(object, key.str());
    }
    return missing("dict", "attribute " + key.repr());
  }
  if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (object.is_list()) {
      const auto n = static_cast<int64_t>(object.list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return missing("list", "element " + key.repr());
      return object.list()[static_cast<size_t>(i)];
    }
    const std::vector<std::string> chars = characters(object.str());
    const auto n = static_cast<int64_t>(chars.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return missing("str", "element " + key.repr());
    return Value(chars[static_cast<size_t>(i)]);
  }
  if (key.is_string()) return get_attr(object, key.str());
  return missing(object.type_name(), "element " + key.repr());
}

Value slice(const Value& object, std::optional<int64_t> start, std::optional<int64_t> stop,
            std::optional<int64_t> step) {
  require_defined(object);
  std::vector<Value> items;
  if (object.is_string()) {
    for (auto& c : characters(object.str())) items.emplace_back(std::move(c));
  } else if (object.is_list()) {
    items = object.list();
  } else {
    throw EvalError("TypeError: '" + object.type_name() + "' object is not subscriptable");
  }
  const auto n = static_cast<int64_t>(items.size());
  const int64_t st = step.value_or(1);
  if (st == 0) throw EvalError("ValueError: slice step cannot be zero");
  // Python's slice.indices: clamp each bound into range, negative ones counted from the end.
  auto clamp = [&](std::optional<int64_t> b, int64_t dflt) {
    if (!b) return dflt;
    int64_t i = *b < 0 ? *b + n : *b;
    if (st > 0) return std::max<int64_t>(0, std::min(i, n));
    return std::max<int64_t>(-1, std::min(i, n - 1));
  };
  const int64_t lo = clamp(start, st > 0 ? 0 : n - 1), hi = clamp(stop, st > 0 ? n : -1);
  List out;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) out.push_back(items[static_cast<size_t>(i)]);
  if (!object.is_string()) return Value(std::move(out));
  std::string s;
  for (const Value& c : out) s += c.str();
  return Value(std::move(s));
}

List iterate(const Value& v) {
  if (v.is_list()) return v.list();
  if (v.is_undefined()) return {};
  if (v.is_dict()) {
    List keys;
    for (const auto& [k, _] : v.dict().items) keys.emplace_back(k);
    return keys;
  }
  if (v.is_string()) {
    List chars;
    for (auto& c : characters(v.str())) chars.emplace_back(std::move(c));
    return chars;
  }
  throw EvalError("TypeError: '" + v.type_name() + "' object is not iterable");
}

}  // namespace specdec::chat
