// Expression parsing by recursive descent, one function per precedence level.
#include <algorithm>

#include "chat/error.h"
#include "chat/parser.h"

namespace specdec::chat {

const Token& TokenStream::peek(size_t ahead) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }

const Token& TokenStream::next() {
  const Token& t = tokens_[pos_];
  if (pos_ + 1 < tokens_.size()) ++pos_;
  return t;
}

bool TokenStream::is_op(const char* op, size_t ahead) const {
  return peek(ahead).type == Token::Type::Op && peek(ahead).text == op;
}
bool TokenStream::is_name(const char* n, size_t ahead) const {
  return peek(ahead).type == Token::Type::Name && peek(ahead).text == n;
}
bool TokenStream::accept_op(const char* op) { return is_op(op) ? (next(), true) : false; }
bool TokenStream::accept_name(const char* n) { return is_name(n) ? (next(), true) : false; }

void TokenStream::expect_op(const char* op) {
  if (!accept_op(op)) fail(std::string("expected '") + op + "'");
}

std::string TokenStream::expect_identifier() {
  if (peek().type != Token::Type::Name) fail("expected a name");
  return next().text;
}

void TokenStream::expect_end() {
  if (!at_end()) fail("unexpected '" + peek().text + "'");
}

void TokenStream::fail(const std::string& what) const {
  const Token& t = peek();
  const std::string at = t.type == Token::Type::End ? " at the end of the tag" : " near '" + t.text + "'";
  throw TemplateError("template " + name_ + " line " + std::to_string(t.line) + ": syntax error: " + what + at);
}

namespace {

ExprPtr make(Expr::Kind kind, int line, std::string name = {}) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  e->name = std::move(name);
  return e;
}

ExprPtr binary(std::string op, ExprPtr l, ExprPtr r) {
  auto e = make(Expr::Kind::Binary, l->line, std::move(op));
  e->args.push_back(std::move(l));
  e->args.push_back(std::move(r));
  return e;
}

ExprPtr parse_unary(TokenStream& ts, bool with_filter);
ExprPtr parse_postfix(TokenStream& ts, ExprPtr e);

// Arguments of a call, filter or test, after its "(": positional, then name=value.
void parse_call_args(TokenStream& ts, Expr& e) {
  while (!ts.accept_op(")")) {
    if (ts.peek().type == Token::Type::Name && ts.is_op("=", 1)) {
      std::string key = ts.next().text;
      ts.next();
      e.kwargs.emplace_back(std::move(key), parse_expression(ts));
    } else {
      e.args.push_back(parse_expression(ts));
    }
    if (!ts.is_op(")")) ts.expect_op(",");
  }
}

ExprPtr parse_sequence(TokenStream& ts, Expr::Kind kind, const char* close, int line) {
  auto e = make(kind, line);
  while (!ts.accept_op(close)) {
    e->args.push_back(parse_expression(ts));
    if (kind == Expr::Kind::Dict) {
      ts.expect_op(":");
      e->args.push_back(parse_expression(ts));
    }
    if (!ts.is_op(close)) ts.expect_op(",");
  }
  return e;
}

ExprPtr parse_primary(TokenStream& ts) {
  const Token t = ts.next();
  switch (t.type) {
    case Token::Type::Int:
    case Token::Type::Float: {
      auto e = make(Expr::Kind::Literal, t.line);
      e->literal = t.type == Token::Type::Int ? Value(t.int_value) : Value(t.float_value);
      return e;
    }
    case Token::Type::String: {
      auto e = make(Expr::Kind::Literal, t.line);
      std::string s = t.text;
      while (ts.peek().type == Token::Type::String) s += ts.next().text;  // "a" "b" is "ab"
      e->literal = Value(std::move(s));
      return e;
    }
    case Token::Type::Name: {
      auto e = make(Expr::Kind::Literal, t.line);
      if (t.text == "true" || t.text == "True") e->literal = Value(true);
      else if (t.text == "false" || t.text == "False") e->literal = Value(false);
      else if (t.text == "none" || t.text == "None") e->literal = Value(nullptr);
      else e = make(Expr::Kind::Name, t.line, t.text);
      return e;
    }
    case Token::Type::Op:
      if (t.text == "[") return parse_sequence(ts, Expr::Kind::List, "]", t.line);
      if (t.text == "{") return parse_sequence(ts, Expr::Kind::Dict, "}", t.line);
      if (t.text == "(") {
        if (ts.accept_op(")")) return make(Expr::Kind::Tuple, t.line);
        ExprPtr first = parse_expression(ts);
        if (ts.accept_op(")")) return first;
        auto tuple = make(Expr::Kind::Tuple, t.line);
        tuple->args.push_back(std::move(first));
        while (ts.accept_op(",") && !ts.is_op(")")) tuple->args.push_back(parse_expression(ts));
        ts.expect_op(")");
        return tuple;
      }
      break;
    case Token::Type::End: break;
  }
  ts.fail("expected an expression");
}

ExprPtr parse_subscript(TokenStream& ts, ExprPtr object) {
  const int line = object->line;
  ExprPtr parts[3];
  int colons = 0;
  while (!ts.accept_op("]")) {
    if (ts.accept_op(":")) {
      if (++colons > 2) ts.fail("too many ':' in a slice");
      continue;
    }
    if (parts[colons]) ts.fail("expected ':' or ']'");
    parts[colons] = parse_expression(ts);
  }
  auto e = make(colons ? Expr::Kind::Slice : Expr::Kind::Subscript, line);
  e->args.push_back(std::move(object));
  if (!colons) {
    if (!parts[0]) ts.fail("empty subscript");
    e->args.push_back(std::move(parts[0]));
    return e;
  }
  for (auto& p : parts) e->args.push_back(std::move(p));
  return e;
}

ExprPtr parse_postfix(TokenStream& ts, ExprPtr e) {
  for (;;) {
    if (ts.accept_op(".")) {
      const Token t = ts.next();
      if (t.type != Token::Type::Name && t.type != Token::Type::Int) ts.fail("expected an attribute name");
      auto a = make(Expr::Kind::Attr, e->line, t.text);
      a->args.push_back(std::move(e));
      e = std::move(a);
    } else if (ts.accept_op("[")) {
      e = parse_subscript(ts, std::move(e));
    } else if (ts.accept_op("(")) {
      auto c = make(Expr::Kind::Call, e->line);
      c->args.push_back(std::move(e));
      parse_call_args(ts, *c);
      e = std::move(c);
    } else {
      return e;
    }
  }
}

// A test's argument without parentheses (`is divisibleby 3`, `is equalto "x"`).
bool starts_test_argument(const TokenStream& ts) {
  const Token& t = ts.peek();
  if (t.type == Token::Type::String || t.type == Token::Type::Int || t.type == Token::Type::Float) return true;
  if (t.type == Token::Type::Op) return t.text == "[" || t.text == "{";
  if (t.type != Token::Type::Name) return false;
  static const char* const kStop[] = {"and", "or", "else", "if", "in", "is", "not", "for"};
  return std::none_of(std::begin(kStop), std::end(kStop), [&](const char* k) { return t.text == k; });
}

ExprPtr parse_filters_and_tests(TokenStream& ts, ExprPtr e) {
  for (;;) {
    if (ts.accept_op("|")) {
      auto f = make(Expr::Kind::Filter, ts.peek().line, ts.expect_identifier());
      f->args.push_back(std::move(e));
      if (ts.accept_op("(")) parse_call_args(ts, *f);
      e = std::move(f);
    } else if (ts.accept_name("is")) {
      const bool negated = ts.accept_name("not");
      auto t = make(Expr::Kind::Test, ts.peek().line, ts.expect_identifier());
      t->negated = negated;
      t->args.push_back(std::move(e));
      if (ts.accept_op("(")) parse_call_args(ts, *t);
      else if (starts_test_argument(ts)) t->args.push_back(parse_postfix(ts, parse_primary(ts)));
      e = std::move(t);
    } else {
      return e;
    }
  }
}

ExprPtr parse_unary(TokenStream& ts, bool with_filter) {
  const TokenStream::Nested nested(ts);
  ExprPtr e;
  if (ts.is_op("-") || ts.is_op("+")) {
    const Token t = ts.next();
    e = make(Expr::Kind::Unary, t.line, t.text);
    e->args.push_back(parse_unary(ts, false));
  } else {
    e = parse_postfix(ts, parse_primary(ts));
  }
  if (!with_filter) return e;
  return parse_filters_and_tests(ts, std::move(e));
}

ExprPtr parse_pow(TokenStream& ts) {
  ExprPtr e = parse_unary(ts, true);
  while (ts.accept_op("**")) e = binary("**", std::move(e), parse_unary(ts, true));
  return e;
}

ExprPtr parse_math2(TokenStream& ts) {
  ExprPtr e = parse_pow(ts);
  for (;;) {
    const char* op = ts.is_op("*") ? "*" : ts.is_op("/") ? "/" : ts.is_op("//") ? "//" : ts.is_op("%") ? "%" : nullptr;
    if (!op) return e;
    ts.next();
    e = binary(op, std::move(e), parse_pow(ts));
  }
}

ExprPtr parse_concat(TokenStream& ts) {
  ExprPtr e = parse_math2(ts);
  while (ts.accept_op("~")) e = binary("~", std::move(e), parse_math2(ts));
  return e;
}

ExprPtr parse_math1(TokenStream& ts) {
  ExprPtr e = parse_concat(ts);
  for (;;) {
    const char* op = ts.is_op("+") ? "+" : ts.is_op("-") ? "-" : nullptr;
    if (!op) return e;
    ts.next();
    e = binary(op, std::move(e), parse_concat(ts));
  }
}

ExprPtr parse_compare(TokenStream& ts) {
  ExprPtr e = parse_math1(ts);
  static const char* const kOps[] = {"==", "!=", "<", ">", "<=", ">="};
  for (;;) {
    std::string op;
    for (const char* o : kOps)
      if (ts.is_op(o)) op = o;
    if (!op.empty()) ts.next();
    else if (ts.accept_name("in")) op = "in";
    else if (ts.is_name("not") && ts.is_name("in", 1)) ts.next(), ts.next(), op = "not in";
    else return e;
    e = binary(op, std::move(e), parse_math1(ts));
  }
}

ExprPtr parse_not(TokenStream& ts) {
  const TokenStream::Nested nested(ts);
  if (ts.is_name("not")) {
    auto e = make(Expr::Kind::Unary, ts.next().line, "not");
    e->args.push_back(parse_not(ts));
    return e;
  }
  return parse_compare(ts);
}

ExprPtr parse_and(TokenStream& ts) {
  ExprPtr e = parse_not(ts);
  while (ts.accept_name("and")) e = binary("and", std::move(e), parse_not(ts));
  return e;
}

}  // namespace

ExprPtr parse_or_expression(TokenStream& ts) {
  ExprPtr e = parse_and(ts);
  while (ts.accept_name("or")) e = binary("or", std::move(e), parse_and(ts));
  return e;
}

ExprPtr parse_expression(TokenStream& ts) {
  ExprPtr e = parse_or_expression(ts);
  if (!ts.accept_name("if")) return e;
  auto t = make(Expr::Kind::Ternary, e->line);
  t->args.push_back(parse_or_expression(ts));
  t->args.push_back(std::move(e));
  t->args.push_back(ts.accept_name("else") ? parse_expression(ts) : nullptr);
  return t;
}

ExprPtr parse_filter_chain(TokenStream& ts, ExprPtr subject) {
  auto f = make(Expr::Kind::Filter, ts.peek().line, ts.expect_identifier());
  f->args.push_back(std::move(subject));
  if (ts.accept_op("(")) parse_call_args(ts, *f);
  return parse_filters_and_tests(ts, std::move(f));
}

}  // namespace specdec::chat
