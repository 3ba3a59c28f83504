// Expression evaluation for the renderer.
#include "chat/builtins.h"
#include "chat/error.h"
#include "chat/operators.h"
#include "chat/renderer.h"

namespace specdec::chat {
namespace {

std::optional<int64_t> slice_bound(const Value& v) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  return v.as_int();
}

}  // namespace

Value Renderer::eval(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::Literal: return e.literal;
    case Expr::Kind::Name: return lookup(e.name);
    case Expr::Kind::List:
    case Expr::Kind::Tuple:
    case Expr::Kind::Dict: return eval_literal_collection(e);
    case Expr::Kind::Attr: return get_attr(eval(*e.args[0]), e.name);
    case Expr::Kind::Subscript: {
      const Value object = eval(*e.args[0]);
      return get_item(object, eval(*e.args[1]));
    }
    case Expr::Kind::Slice: {
      const Value object = eval(*e.args[0]);
      auto part = [&](size_t i) { return e.args[i] ? slice_bound(eval(*e.args[i])) : std::nullopt; };
      return slice(object, part(1), part(2), part(3));
    }
    case Expr::Kind::Call: return eval_call(e);
    case Expr::Kind::Filter: return eval_filter(e);
    case Expr::Kind::Test: return eval_test(e);
    case Expr::Kind::Unary: {
      const Value v = eval(*e.args[0]);
      if (e.name == "not") return Value(!v.truthy());
      if (e.name == "+") return v.is_float() ? Value(v.as_double()) : Value(v.as_int());
      return v.is_float() ? Value(-v.as_double()) : Value(-v.as_int());
    }
    case Expr::Kind::Binary: return eval_binary(e);
    case Expr::Kind::Ternary:
      if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
      return e.args[2] ? eval(*e.args[2]) : Value::undefined("the condition was false and there is no else");
  }
  return Value();
}

Value Renderer::eval_literal_collection(const Expr& e) {
  if (e.kind == Expr::Kind::Dict) {
    Dict d;
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) d.set(eval(*e.args[i]).to_str(), eval(*e.args[i + 1]));
    return Value(std::move(d));
  }
  List items;
  for (const auto& a : e.args) items.push_back(eval(*a));
  return e.kind == Expr::Kind::Tuple ? Value::tuple(std::move(items)) : Value(std::move(items));
}

Value Renderer::eval_binary(const Expr& e) {
  // and/or short-circuit and give back an operand, as Python's do.
  if (e.name == "and") {
    Value l = eval(*e.args[0]);
    return l.truthy() ? eval(*e.args[1]) : l;
  }
  if (e.name == "or") {
    Value l = eval(*e.args[0]);
    return l.truthy() ? l : eval(*e.args[1]);
  }
  const Value l = eval(*e.args[0]);
  return binary_op(e.name, l, eval(*e.args[1]));
}

CallArgs Renderer::eval_args(const Expr& e) {
  CallArgs a;
  for (size_t i = 1; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
  for (const auto& [k, v] : e.kwargs) a.named.emplace_back(k, eval(*v));
  return a;
}

Value Renderer::eval_call(const Expr& e) {
  const Value callee = eval(*e.args[0]);
  if (!callee.is_function()) {
    require_defined(callee);
    throw EvalError("TypeError: '" + callee.type_name() + "' object is not callable");
  }
  return callee.function().call(eval_args(e));
}

Value Renderer::eval_filter(const Expr& e) {
  const FilterFn* f = find_filter(e.name);
  if (!f) throw EvalError("no filter named '" + e.name + "'");
  const Value subject = eval(*e.args[0]);
  return (*f)(subject, eval_args(e));
}

Value Renderer::eval_test(const Expr& e) {
  const TestFn* t = find_test(e.name);
  if (!t) throw EvalError("no test named '" + e.name + "'");
  const Value subject = eval(*e.args[0]);
  return Value((*t)(subject, eval_args(e)) != e.negated);
}

}  // namespace specdec::chat
