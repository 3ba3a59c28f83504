// jinja2's sequence filters: join, first/last, list, items, unique, reverse, sort, dictsort,
// select/reject(attr), map, batch, min/max/sum.
#include <algorithm>
#include <map>

#include "chat/builtins.h"
#include "chat/error.h"
#include "chat/operators.h"

namespace specdec::chat {
namespace {

// `attribute="a.b"` as jinja2 reads it: dotted item lookups, integer parts as indices.
Value attribute_of(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = std::min(path.find('.', start), path.size());
    const std::string part = path.substr(start, dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = get_item(v, digits ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    start = dot + 1;
  }
  return v;
}

// select/reject/selectattr/rejectattr: keep the items whose (attribute's) test result is `keep`.
Value select(const Value& seq, const CallArgs& a, bool by_attr, bool keep) {
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    if (a.positional.empty()) throw EvalError("selectattr/rejectattr needs an attribute name");
    attr = a.positional[next++].to_str();
  }
  const TestFn* test = nullptr;
  CallArgs test_args;
  if (next < a.positional.size()) {
    const std::string name = a.positional[next++].to_str();
    test = find_test(name);
    if (!test) throw EvalError("no test named '" + name + "'");
    test_args.positional.assign(a.positional.begin() + static_cast<long>(next), a.positional.end());
  }
  List out;
  if (!seq.truthy()) return Value(std::move(out));  // jinja2 yields nothing for any falsy input, None too
  for (const Value& item : iterate(seq)) {
    const Value subject = by_attr ? attribute_of(item, attr) : item;
    const bool passed = test ? (*test)(subject, test_args) : subject.truthy();
    if (passed == keep) out.push_back(item);
  }
  return Value(std::move(out));
}

Value map_filter(const Value& seq, const CallArgs& a) {
  List out;
  if (!seq.truthy()) return Value(std::move(out));  // as select: a falsy input, None too, maps to nothing
  if (const Value* attr = a.get(99, "attribute")) {
    const Value* dflt = a.get(99, "default");
    for (const Value& item : iterate(seq)) {
      Value v = attribute_of(item, attr->to_str());
      out.push_back(v.is_undefined() && dflt ? *dflt : v);
    }
    return Value(std::move(out));
  }
  if (a.positional.empty()) throw EvalError("map needs a filter name or attribute=");
  const std::string name = a.positional[0].to_str();
  const FilterFn* f = find_filter(name);
  if (!f) throw EvalError("no filter named '" + name + "'");
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.named = a.named;
  for (const Value& item : iterate(seq)) out.push_back((*f)(item, rest));
  return Value(std::move(out));
}

// sort's ordering: strings compared without case unless case_sensitive, as jinja2 does.
Value sort_key(const Value& v, bool case_sensitive) {
  if (v.is_string() && !case_sensitive) {
    std::string s = v.str();
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return Value(std::move(s));
  }
  return v;
}

Value sort_filter(const Value& seq, const CallArgs& a) {
  const Value* rev = a.get(0, "reverse");
  const Value* cs = a.get(1, "case_sensitive");
  const Value* attr = a.get(2, "attribute");
  List items = iterate(seq);
  const bool case_sensitive = cs && cs->truthy();
  auto key = [&](const Value& v) { return sort_key(attr ? attribute_of(v, attr->to_str()) : v, case_sensitive); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) { return less(key(x), key(y)); });
  if (rev && rev->truthy()) std::reverse(items.begin(), items.end());
  return Value(std::move(items));
}

Value dictsort(const Value& d, const CallArgs& a) {
  if (!d.is_dict()) throw EvalError("dictsort expects a dict");
  const Value* cs = a.get(0, "case_sensitive");
  const Value* by = a.get(1, "by");
  const Value* rev = a.get(2, "reverse");
  const bool by_value = by && by->to_str() == "value";
  List items;
  for (const auto& [k, v] : d.dict().items) items.push_back(Value::tuple({Value(k), v}));
  auto key = [&](const Value& t) { return sort_key(t.list()[by_value ? 1 : 0], cs && cs->truthy()); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) { return less(key(x), key(y)); });
  if (rev && rev->truthy()) std::reverse(items.begin(), items.end());
  return Value(std::move(items));
}

Value extreme(const Value& seq, const CallArgs& a, bool want_max) {
  const List items = iterate(seq);
  if (items.empty()) return Value::undefined("no items to compare");
  const Value* attr = a.get(1, "attribute");
  auto key = [&](const Value& v) { return sort_key(attr ? attribute_of(v, attr->to_str()) : v, false); };
  Value best = items[0];
  for (const Value& v : items)
    if (want_max ? less(key(best), key(v)) : less(key(v), key(best))) best = v;
  return best;
}

}  // namespace

void add_sequence_filters(std::map<std::string, FilterFn>& f) {
  f["join"] = [](const Value& v, const CallArgs& a) {
    const Value* sep = a.get(0, "d");
    const Value* attr = a.get(1, "attribute");
    std::string out;
    const List items = iterate(v);
    for (size_t i = 0; i < items.size(); ++i)
      out += (i && sep ? sep->to_str() : "") + (attr ? attribute_of(items[i], attr->to_str()) : items[i]).to_str();
    return Value(std::move(out));
  };
  f["first"] = [](const Value& v, const CallArgs&) {
    const List l = iterate(v);
    return l.empty() ? Value::undefined("no first item, sequence was empty") : l.front();
  };
  f["last"] = [](const Value& v, const CallArgs&) {
    const List l = iterate(v);
    return l.empty() ? Value::undefined("no last item, sequence was empty") : l.back();
  };
  f["list"] = [](const Value& v, const CallArgs&) { return Value(iterate(v)); };
  f["items"] = [](const Value& v, const CallArgs&) {
    if (v.is_undefined()) return Value(List{});
    if (!v.is_dict()) throw EvalError("items expects a mapping");
    List out;
    for (const auto& [k, x] : v.dict().items) out.push_back(Value::tuple({Value(k), x}));
    return Value(std::move(out));
  };
  f["unique"] = [](const Value& v, const CallArgs&) {
    List out;
    for (const Value& x : iterate(v))
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
    return Value(std::move(out));
  };
  f["reverse"] = [](const Value& v, const CallArgs&) {
    if (v.is_string()) return slice(v, std::nullopt, std::nullopt, -1);
    List l = iterate(v);
    std::reverse(l.begin(), l.end());
    return Value(std::move(l));
  };
  f["sort"] = sort_filter;
  f["dictsort"] = dictsort;
  f["select"] = [](const Value& v, const CallArgs& a) { return select(v, a, false, true); };
  f["reject"] = [](const Value& v, const CallArgs& a) { return select(v, a, false, false); };
  f["selectattr"] = [](const Value& v, const CallArgs& a) { return select(v, a, true, true); };
  f["rejectattr"] = [](const Value& v, const CallArgs& a) { return select(v, a, true, false); };
  f["map"] = map_filter;
  f["min"] = [](const Value& v, const CallArgs& a) { return extreme(v, a, false); };
  f["max"] = [](const Value& v, const CallArgs& a) { return extreme(v, a, true); };
  f["sum"] = [](const Value& v, const CallArgs& a) {
    const Value* start = a.get(1, "start");
    Value total = start ? *start : Value(int64_t{0});
    for (const Value& x : iterate(v)) total = binary_op("+", total, x);
    return total;
  };
  f["batch"] = [](const Value& v, const CallArgs& a) {
    const int64_t n = a.get(0, "linecount") ? a.get(0, "linecount")->as_int() : 1;
    if (n <= 0) throw EvalError("batch size must be positive");
    List out;
    for (const Value& x : iterate(v)) {
      if (out.empty() || static_cast<int64_t>(out.back().list().size()) == n) out.emplace_back(List{});
      out.back().list().push_back(x);
    }
    if (const Value* fill = a.get(1, "fill_with"); fill && !out.empty())
      while (static_cast<int64_t>(out.back().list().size()) < n) out.back().list().push_back(*fill);
    return Value(std::move(out));
  };
}

}  // namespace specdec::chat
