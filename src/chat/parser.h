// Parsing: chunks and tokens into the tree of ast.h. Expressions follow jinja2's precedence
// (ternary, or, and, not, comparisons and `in`, + -, ~, * / // %, **, unary, postfix, filters
// and tests); statements are the block tags that chat templates use.
#pragma once

#include <string>
#include <vector>

#include "chat/ast.h"
#include "chat/lexer.h"

namespace specdec::chat {

class TokenStream {
 public:
  TokenStream(std::vector<Token> tokens, std::string name) : tokens_(std::move(tokens)), name_(std::move(name)) {}
  const Token& peek(size_t ahead = 0) const;
  const Token& next();
  bool at_end() const { return peek().type == Token::Type::End; }
  bool is_op(const char* op, size_t ahead = 0) const;
  bool is_name(const char* n, size_t ahead = 0) const;
  bool accept_op(const char* op);
  bool accept_name(const char* n);
  void expect_op(const char* op);
  std::string expect_identifier();
  void expect_end();
  [[noreturn]] void fail(const std::string& what) const;
  const std::string& template_name() const { return name_; }

  // Held while an expression nests one level deeper (a parenthesis, bracket or brace, a unary
  // operator): past kMaxNesting levels the template is refused, since parsing and evaluating it
  // recurse once per level and would exhaust the stack long before any real template gets there.
  static constexpr int kMaxNesting = 200;
  class Nested {
   public:
    explicit Nested(TokenStream& ts) : ts_(ts) {
      if (++ts_.depth_ > kMaxNesting) {
        --ts_.depth_;
        ts_.fail("expression nested more than " + std::to_string(kMaxNesting) + " levels deep");
      }
    }
    ~Nested() { --ts_.depth_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    TokenStream& ts_;
  };

 private:
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  std::string name_;
  int depth_ = 0;
};

ExprPtr parse_expression(TokenStream& ts);
// An expression without a trailing `if`, as a for loop's iterable is (its `if` filters).
ExprPtr parse_or_expression(TokenStream& ts);
// A filter chain `name(args) | name ...` applied to `subject` (for {% filter %} blocks).
ExprPtr parse_filter_chain(TokenStream& ts, ExprPtr subject);

Body parse_template(const std::string& source, const std::string& name);

}  // namespace specdec::chat
