// jinja2's filters that chat templates use. String and number filters are registered here,
// sequence filters (select, map, sort, ...) in filters_sequence.cpp.
#include <cmath>
#include <map>

#include "chat/builtins.h"
#include "chat/error.h"
#include "chat/operators.h"
#include "chat/text.h"

namespace specdec::chat {

void add_sequence_filters(std::map<std::string, FilterFn>& f);  // filters_sequence.cpp

namespace {

int64_t int_arg(const CallArgs& a, size_t i, const char* name, int64_t dflt) {
  const Value* v = a.get(i, name);
  return v ? v->as_int() : dflt;
}

bool bool_arg(const CallArgs& a, size_t i, const char* name) {
  const Value* v = a.get(i, name);
  return v && v->truthy();
}

Value length(const Value& v) {
  if (v.is_string()) return Value(characters(v.str()).size());
  if (v.is_list()) return Value(v.list().size());
  if (v.is_dict()) return Value(v.dict().items.size());
  if (v.is_undefined()) return Value(int64_t{0});
  throw EvalError("TypeError: object of type '" + v.type_name() + "' has no len()");
}

Value to_int(const Value& v, const CallArgs& a) {
  const int64_t dflt = int_arg(a, 0, "default", 0);
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) return Value(static_cast<int64_t>(v.as_double()));
  if (v.is_string()) {
    try {
      size_t used = 0;
      const std::string s = strip(v.str(), std::nullopt, true, true);
      const int64_t i = std::stoll(s, &used);
      if (used == s.size()) return Value(i);
      return Value(static_cast<int64_t>(std::stod(s)));
    } catch (const std::exception&) {
      return Value(dflt);
    }
  }
  return Value(dflt);
}

Value to_float(const Value& v, const CallArgs& a) {
  const Value* d = a.get(0, "default");
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    try {
      return Value(std::stod(v.str()));
    } catch (const std::exception&) {
    }
  }
  return d ? Value(d->as_double()) : Value(0.0);
}

Value round_filter(const Value& v, const CallArgs& a) {
  const int64_t precision = int_arg(a, 0, "precision", 0);
  const Value* m = a.get(1, "method");
  const std::string method = m ? m->to_str() : "common";
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_double() * scale;
  const double r = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
  return Value(r / scale);
}

Value indent(const Value& v, const CallArgs& a) {
  const Value* w = a.get(0, "width");
  const std::string pad = w && w->is_string() ? w->str() : std::string(static_cast<size_t>(w ? w->as_int() : 4), ' ');
  const bool first = bool_arg(a, 1, "first"), blank = bool_arg(a, 2, "blank");
  std::vector<std::string> lines = split(v.to_str(), std::string("\n"), -1);
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    if ((i > 0 || first) && (blank || !lines[i].empty())) out += pad;
    out += lines[i];
  }
  if (!v.to_str().empty() && v.to_str().back() == '\n') out += "\n";
  return Value(std::move(out));
}

Value tojson(const Value& v, const CallArgs& a) {
  const Value* ind = a.get(0, "indent");
  const Value* sort = a.get(99, "sort_keys");
  return Value(to_json(v, ind && !ind->is_none() ? std::optional<int>(static_cast<int>(ind->as_int())) : std::nullopt,
                       sort && sort->truthy()));
}

void add_string_filters(std::map<std::string, FilterFn>& f) {
  f["length"] = f["count"] = [](const Value& v, const CallArgs&) { return length(v); };
  f["string"] = [](const Value& v, const CallArgs&) { return Value(v.to_str()); };
  f["safe"] = [](const Value& v, const CallArgs&) { return v.is_string() ? v : Value(v.to_str()); };
  f["trim"] = [](const Value& v, const CallArgs& a) {
    const Value* c = a.get(0, "chars");
    return Value(strip(v.to_str(), c && !c->is_none() ? std::optional(c->to_str()) : std::nullopt, true, true));
  };
  f["upper"] = [](const Value& v, const CallArgs&) { return Value(to_upper(v.to_str())); };
  f["lower"] = [](const Value& v, const CallArgs&) { return Value(to_lower(v.to_str())); };
  f["title"] = [](const Value& v, const CallArgs&) { return Value(title_case(v.to_str())); };
  f["capitalize"] = [](const Value& v, const CallArgs&) { return Value(capitalize(v.to_str())); };
  f["e"] = f["escape"] = [](const Value& v, const CallArgs&) { return Value(html_escape(v.to_str())); };
  f["replace"] = [](const Value& v, const CallArgs& a) {
    const Value *from = a.get(0, "old"), *to = a.get(1, "new");
    if (!from || !to) throw EvalError("replace needs two arguments");
    return Value(replace_all(v.to_str(), from->to_str(), to->to_str(), int_arg(a, 2, "count", -1)));
  };
  f["wordcount"] = [](const Value& v, const CallArgs&) { return Value(split(v.to_str(), std::nullopt, -1).size()); };
  f["indent"] = indent;
  f["tojson"] = tojson;
  f["int"] = to_int;
  f["float"] = to_float;
  f["round"] = round_filter;
  f["abs"] = [](const Value& v, const CallArgs&) {
    return v.is_float() ? Value(std::fabs(v.as_double())) : Value(static_cast<int64_t>(std::llabs(v.as_int())));
  };
  f["d"] = f["default"] = [](const Value& v, const CallArgs& a) {
    const Value* d = a.get(0, "default_value");
    const bool boolean = bool_arg(a, 1, "boolean");
    if (v.is_undefined() || (boolean && !v.truthy())) return d ? *d : Value(std::string());
    return v;
  };
}

}  // namespace

const FilterFn* find_filter(const std::string& name) {
  static const std::map<std::string, FilterFn> filters = [] {
    std::map<std::string, FilterFn> f;
    add_string_filters(f);
    add_sequence_filters(f);
    return f;
  }();
  const auto it = filters.find(name);
  return it == filters.end() ? nullptr : &it->second;
}

}  // namespace specdec::chat
