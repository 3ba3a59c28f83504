// jinja2's tests (`x is defined`, `x is string`, ...), with Python's type rules: a bool is a
// number but not an integer; strings, lists and dicts are sequences and iterables.
#include <map>
#include <string>

#include "chat/builtins.h"
#include "chat/error.h"
#include "chat/operators.h"

namespace specdec::chat {
namespace {

const Value& arg(const CallArgs& a, const char* test) {
  if (a.positional.empty()) throw EvalError(std::string("test '") + test + "' needs an argument");
  return a.positional[0];
}

std::map<std::string, TestFn> make_tests() {
  std::map<std::string, TestFn> t;
  t["defined"] = [](const Value& v, const CallArgs&) { return !v.is_undefined(); };
  t["undefined"] = [](const Value& v, const CallArgs&) { return v.is_undefined(); };
  t["none"] = [](const Value& v, const CallArgs&) { return v.is_none(); };
  t["string"] = [](const Value& v, const CallArgs&) { return v.is_string(); };
  t["number"] = [](const Value& v, const CallArgs&) { return v.is_number(); };
  t["integer"] = [](const Value& v, const CallArgs&) { return v.is_int(); };
  t["float"] = [](const Value& v, const CallArgs&) { return v.is_float(); };
  t["boolean"] = [](const Value& v, const CallArgs&) { return v.is_bool(); };
  t["true"] = [](const Value& v, const CallArgs&) { return v.is_bool() && std::get<bool>(v.v); };
  t["false"] = [](const Value& v, const CallArgs&) { return v.is_bool() && !std::get<bool>(v.v); };
  t["mapping"] = [](const Value& v, const CallArgs&) { return v.is_dict() && !v.dict().is_namespace; };
  t["iterable"] = [](const Value& v, const CallArgs&) {
    return v.is_list() || v.is_string() || (v.is_dict() && !v.dict().is_namespace) || v.is_undefined();
  };
  t["sequence"] = [](const Value& v, const CallArgs&) {
    return v.is_list() || v.is_string() || (v.is_dict() && !v.dict().is_namespace) || v.is_undefined();
  };
  t["callable"] = [](const Value& v, const CallArgs&) { return v.is_function(); };
  t["odd"] = [](const Value& v, const CallArgs&) { return v.as_int() % 2 != 0; };
  t["even"] = [](const Value& v, const CallArgs&) { return v.as_int() % 2 == 0; };
  t["divisibleby"] = [](const Value& v, const CallArgs& a) {
    const int64_t d = arg(a, "divisibleby").as_int();
    return d != 0 && v.as_int() % d == 0;
  };
  t["eq"] = t["equalto"] = t["=="] = [](const Value& v, const CallArgs& a) { return equal(v, arg(a, "eq")); };
  t["ne"] = t["!="] = [](const Value& v, const CallArgs& a) { return !equal(v, arg(a, "ne")); };
  t["lt"] = t["lessthan"] = [](const Value& v, const CallArgs& a) { return less(v, arg(a, "lt")); };
  t["gt"] = t["greaterthan"] = [](const Value& v, const CallArgs& a) { return less(arg(a, "gt"), v); };
  t["le"] = [](const Value& v, const CallArgs& a) { return !less(arg(a, "le"), v); };
  t["ge"] = [](const Value& v, const CallArgs& a) { return !less(v, arg(a, "ge")); };
  t["in"] = [](const Value& v, const CallArgs& a) { return contains(arg(a, "in"), v); };
  t["sameas"] = [](const Value& v, const CallArgs& a) {
    const Value& o = arg(a, "sameas");
    return v.v.index() == o.v.index() && equal(v, o);
  };
  t["lower"] = [](const Value& v, const CallArgs&) {
    return v.is_string() && v.str().find_first_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ") == std::string::npos;
  };
  t["upper"] = [](const Value& v, const CallArgs&) {
    return v.is_string() && v.str().find_first_of("abcdefghijklmnopqrstuvwxyz") == std::string::npos;
  };
  return t;
}

}  // namespace

const TestFn* find_test(const std::string& name) {
  static const std::map<std::string, TestFn> tests = make_tests();
  const auto it = tests.find(name);
  return it == tests.end() ? nullptr : &it->second;
}

}  // namespace specdec::chat
