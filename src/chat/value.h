// The values a template computes with: Python's types as jinja2 sees them (undefined, None, bool,
// int, float, str, list, dict, callables). Lists and dicts are shared by reference, as in Python,
// so that a namespace or a list changed through one name is changed for all.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace specdec::chat {

struct Value;
using List = std::vector<Value>;

// Insertion-ordered, as Python's dict is; templates are small, so lookup is a linear scan.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // jinja2's namespace(): attributes may be assigned with set
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
  // The argument at position i or named `name`, or nullptr when neither was given.
  const Value* get(size_t i, const std::string& name) const;
};

struct Function {
  std::string name;
  std::function<Value(const CallArgs&)> call;
};

struct Undefined {
  std::string name;  // why it is undefined ("'x' is undefined"), for the error when it is used
};

struct Value {
  using Storage = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, std::shared_ptr<List>,
                               std::shared_ptr<Dict>, std::shared_ptr<Function>>;
  Storage v;
  bool is_tuple = false;  // a list written (a, b) or made by items(); printed with parentheses

  Value() : v(Undefined{}) {}
  Value(Storage s) : v(std::move(s)) {}
  Value(std::nullptr_t) : v(nullptr) {}
  Value(bool b) : v(b) {}
  Value(int i) : v(int64_t{i}) {}
  Value(int64_t i) : v(i) {}
  Value(size_t i) : v(static_cast<int64_t>(i)) {}
  Value(double d) : v(d) {}
  Value(std::string s) : v(std::move(s)) {}
  Value(const char* s) : v(std::string(s)) {}
  Value(List l) : v(std::make_shared<List>(std::move(l))) {}
  Value(Dict d) : v(std::make_shared<Dict>(std::move(d))) {}

  static Value undefined(std::string name) { return Value(Storage(Undefined{std::move(name)})); }
  static Value function(std::string name, std::function<Value(const CallArgs&)> f);
  static Value tuple(List l);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(v); }
  bool is_bool() const { return std::holds_alternative<bool>(v); }
  bool is_int() const { return std::holds_alternative<int64_t>(v); }
  bool is_float() const { return std::holds_alternative<double>(v); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<List>>(v); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<Dict>>(v); }
  bool is_function() const { return std::holds_alternative<std::shared_ptr<Function>>(v); }

  const std::string& str() const { return std::get<std::string>(v); }
  List& list() const { return *std::get<std::shared_ptr<List>>(v); }
  Dict& dict() const { return *std::get<std::shared_ptr<Dict>>(v); }
  const Function& function() const { return *std::get<std::shared_ptr<Function>>(v); }
  int64_t as_int() const;    // bool or int; throws otherwise
  double as_double() const;  // bool, int or float; throws otherwise

  bool truthy() const;
  std::string to_str() const;   // Python's str(); undefined is ""
  std::string repr() const;     // Python's repr()
  std::string type_name() const;  // Python's type name, for errors
};

bool equal(const Value& a, const Value& b);
// Python's <, for numbers, strings and lists; throws for anything else.
bool less(const Value& a, const Value& b);
// Throws jinja2's "'x' is undefined" error when v is undefined, for operations that cannot take it.
void require_defined(const Value& v);

Value from_json(const nlohmann::ordered_json& j);
std::string format_float(double d);  // Python's repr of a float

// A str's characters (UTF-8 sequences), since Python indexes and counts code points, not bytes.
std::vector<std::string> characters(const std::string& s);

}  // namespace specdec::chat
