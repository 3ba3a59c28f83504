// The Python methods that templates call on values: str (strip, split, startswith, ...), dict
// (get, items, keys, values) and list (append, pop, index, count).
#include <algorithm>
#include <cctype>

#include "chat/error.h"
#include "chat/operators.h"
#include "chat/text.h"

namespace specdec::chat {
namespace {

std::string string_arg(const CallArgs& a, size_t i, const std::string& name, const std::string& method) {
  const Value* v = a.get(i, name);
  if (!v || !v->is_string()) throw EvalError("TypeError: " + method + "() expects a string argument");
  return v->str();
}

// startswith/endswith take a string or a tuple of strings.
bool affix_matches(const std::string& s, const Value& arg, bool prefix) {
  if (arg.is_list()) {
    for (const Value& a : arg.list())
      if (affix_matches(s, a, prefix)) return true;
    return false;
  }
  if (!arg.is_string()) throw EvalError("TypeError: startswith/endswith expects a string or a tuple of strings");
  const std::string& a = arg.str();
  if (a.size() > s.size()) return false;
  return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
}

Value string_method(const std::string& s, const std::string& name, const CallArgs& a) {
  auto chars_arg = [&]() -> std::optional<std::string> {
    const Value* v = a.get(0, "chars");
    if (!v || v->is_none()) return std::nullopt;
    return v->to_str();
  };
  if (name == "strip") return Value(strip(s, chars_arg(), true, true));
  if (name == "lstrip") return Value(strip(s, chars_arg(), true, false));
  if (name == "rstrip") return Value(strip(s, chars_arg(), false, true));
  if (name == "upper") return Value(to_upper(s));
  if (name == "lower") return Value(to_lower(s));
  if (name == "title") return Value(title_case(s));
  if (name == "capitalize") return Value(capitalize(s));
  if (name == "startswith" || name == "endswith") {
    const Value* p = a.get(0, "prefix");
    if (!p) throw EvalError("TypeError: " + name + "() takes at least 1 argument");
    return Value(affix_matches(s, *p, name == "startswith"));
  }
  if (name == "split" || name == "rsplit") {
    const Value* sep = a.get(0, "sep");
    const Value* max = a.get(1, "maxsplit");
    List out;
    for (auto& part : split(s, sep && !sep->is_none() ? std::optional(sep->to_str()) : std::nullopt,
                            max ? max->as_int() : -1, name == "rsplit"))
      out.emplace_back(std::move(part));
    return Value(std::move(out));
  }
  if (name == "replace") {
    const Value* count = a.get(2, "count");
    return Value(replace_all(s, string_arg(a, 0, "old", name), string_arg(a, 1, "new", name),
                             count ? count->as_int() : -1));
  }
  if (name == "find") {
    const size_t at = s.find(string_arg(a, 0, "sub", name));
    return Value(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(characters(s.substr(0, at)).size()));
  }
  if (name == "count") {
    const std::string sub = string_arg(a, 0, "sub", name);
    int64_t n = 0;
    for (size_t at = s.find(sub); !sub.empty() && at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return Value(n);
  }
  if (name == "join") {
    std::string out;
    const List items = iterate(*a.get(0, "iterable"));
    for (size_t i = 0; i < items.size(); ++i) out += (i ? s : "") + items[i].to_str();
    return Value(std::move(out));
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum") {
    int (*pred)(int) = name == "isdigit" ? ::isdigit : name == "isalpha" ? ::isalpha : name == "isspace" ? ::isspace : ::isalnum;
    return Value(!s.empty() && std::all_of(s.begin(), s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)) != 0; }));
  }
  throw EvalError("str has no method '" + name + "'");
}

Value dict_method(const Value& self, const std::string& name, const CallArgs& a) {
  Dict& d = self.dict();
  if (name == "get") {
    const Value* key = a.get(0, "key");
    const Value* dflt = a.get(1, "default");
    const Value* v = key && key->is_string() ? d.find(key->str()) : nullptr;
    return v ? *v : dflt ? *dflt : Value(nullptr);
  }
  if (name == "items") {
    List out;
    for (const auto& [k, v] : d.items) out.push_back(Value::tuple({Value(k), v}));
    return Value(std::move(out));
  }
  if (name == "keys" || name == "values") {
    List out;
    for (const auto& [k, v] : d.items) out.push_back(name == "keys" ? Value(k) : v);
    return Value(std::move(out));
  }
  throw EvalError("dict has no method '" + name + "'");
}

Value list_method(const Value& self, const std::string& name, const CallArgs& a) {
  List& l = self.list();
  if (name == "append") {
    l.push_back(a.positional.empty() ? Value(nullptr) : a.positional[0]);
    return Value(nullptr);
  }
  if (name == "pop") {
    if (l.empty()) throw EvalError("IndexError: pop from empty list");
    auto i = a.positional.empty() ? static_cast<int64_t>(l.size()) - 1 : a.positional[0].as_int();
    if (i < 0) i += static_cast<int64_t>(l.size());
    if (i < 0 || i >= static_cast<int64_t>(l.size())) throw EvalError("IndexError: pop index out of range");
    Value out = l[static_cast<size_t>(i)];
    l.erase(l.begin() + i);
    return out;
  }
  if (name == "index" || name == "count") {
    const Value& x = a.positional.empty() ? Value() : a.positional[0];
    int64_t n = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      if (!equal(l[i], x)) continue;
      if (name == "index") return Value(static_cast<int64_t>(i));
      ++n;
    }
    if (name == "index") throw EvalError("ValueError: value is not in list");
    return Value(n);
  }
  throw EvalError("list has no method '" + name + "'");
}

bool has_method(const Value& v, const std::string& n) {
  static const char* const kStr[] = {"strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize",
                                     "startswith", "endswith", "split", "rsplit", "replace", "find", "count",
                                     "join", "isdigit", "isalpha", "isspace", "isalnum"};
  static const char* const kDict[] = {"get", "items", "keys", "values"};
  static const char* const kList[] = {"append", "pop", "index", "count"};
  auto in = [&](const auto& names) { return std::any_of(std::begin(names), std::end(names), [&](const char* m) { return n == m; }); };
  if (v.is_string()) return in(kStr);
  if (v.is_dict()) return !v.dict().is_namespace && in(kDict);
  if (v.is_list()) return in(kList);
  return false;
}

}  // namespace

Value bound_method(const Value& object, const std::string& name) {
  if (!has_method(object, name)) return Value::undefined("");
  return Value::function(name, [object, name](const CallArgs& a) {
    if (object.is_string()) return string_method(object.str(), name, a);
    if (object.is_dict()) return dict_method(object, name, a);
    return list_method(object, name, a);
  });
}

}  // namespace specdec::chat
